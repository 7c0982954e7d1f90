//! The containers' output of one resource, as `voodu-agent logs` and the dashboard show it:
//! every container of `SCOPE/NAME` on this agent (its replicas, their init containers, its
//! release hooks, job and cron runs: `voodu.name` is `NAME`, or `NAME-release` for the hooks),
//! or one of them (`--replica`, by container name or replica id), or those of one release;
//! each line masked (`model::logs::Masker`: the config values, the registry tokens and the
//! resource's sealed env values the agent knows, read from state.db, never from a container),
//! escaped and cut (`Masker::show`), and named by its container. Followed, a container that
//! starts joins the stream (its `start` event), one that stops leaves it (its output ends).
//!
//! Invariants: reads only (the engine's logs, list and events, state.db); every container's
//! reader holds one bounded line (`Splitter`) and waits while the stream's channel of
//! [`CHANNEL`] items is full, so a client that reads slowly holds the engine back, never the
//! agent's memory; everything ends when the stream's reader is dropped; at most
//! [`MAX_CONTAINERS`] containers are read at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::StreamExt as _;
use tokio::sync::mpsc;

use crate::assets::sops::Keyring;
use crate::http::logs::{LogItem, LogLines, LogQuery, LogSource};
use crate::manifest::spec::Spec;
use crate::model::logs::{Masker, Shown, Splitter};
use crate::model::text::escape;
use crate::model::{Kind, ResourceKey};
use crate::runtime::{Container, ContainerState, LogOptions, Runtime, labels};
use crate::store::Store;

/// Items waiting between the containers' readers and the stream's reader.
pub const CHANNEL: usize = 256;
/// Containers read at once; more are named in a note and left out.
pub const MAX_CONTAINERS: usize = 64;

/// The resource kinds that run containers, in the order a name is looked up.
const KINDS: [Kind; 4] = [
    Kind::Deployment,
    Kind::Statefulset,
    Kind::Job,
    Kind::Cronjob,
];

/// Opens log streams over `runtime`'s containers of agent `agent_id`.
pub struct Follower<R> {
    runtime: Arc<R>,
    store: Arc<Store>,
    agent_id: String,
    keyring: Arc<Keyring>,
}

impl<R: Runtime> Follower<R> {
    pub fn new(
        runtime: Arc<R>,
        store: Arc<Store>,
        agent_id: String,
        keyring: Arc<Keyring>,
    ) -> Follower<R> {
        Follower {
            runtime,
            store,
            agent_id,
            keyring,
        }
    }
}

impl<R: Runtime> LogSource for Follower<R> {
    fn open(&self, query: LogQuery) -> LogLines {
        let (sender, receiver) = mpsc::channel(CHANNEL);
        let runtime = Arc::clone(&self.runtime);
        let store = Arc::clone(&self.store);
        let keyring = Arc::clone(&self.keyring);
        let agent_id = self.agent_id.clone();
        tokio::spawn(async move {
            let masker = match masker(store, keyring, &query).await {
                Ok(masker) => Arc::new(masker),
                Err(error) => {
                    // Nothing is shown unmasked.
                    let note = format!("cannot read the values to mask: {}", escape(&error));
                    let _ = sender.send(LogItem::Note(note)).await;
                    return;
                }
            };
            stream(runtime, agent_id, query, masker, sender).await;
        });
        Box::pin(futures_util::stream::unfold(
            receiver,
            |mut receiver| async move {
                let item = receiver.recv().await?;
                Some((item, receiver))
            },
        ))
    }
}

/// The values to mask: every config bucket value, every registry token and the sealed env
/// values of `query`'s resource (decrypted with the agent's identities).
async fn masker(
    store: Arc<Store>,
    keyring: Arc<Keyring>,
    query: &LogQuery,
) -> Result<Masker, String> {
    let keys: Vec<ResourceKey> = KINDS
        .iter()
        .map(|kind| ResourceKey::new(*kind, &query.scope, &query.name))
        .collect();
    let (buckets, registries, resources, blobs) = crate::store::blocking(&store, move |store| {
        let buckets = store.buckets()?;
        let registries = store.desired_of_kind(Kind::Registry)?;
        let resources = store.desired_of(&keys)?;
        let mut blobs = Vec::new();
        for resource in &resources {
            for digest in resource.spec.sealed_digests() {
                blobs.extend(store.blob(digest)?);
            }
        }
        Ok((buckets, registries, resources, blobs))
    })
    .await
    .map_err(|error| error.to_string())?;
    drop(resources);
    let mut values: Vec<String> = buckets
        .into_values()
        .flat_map(BTreeMap::into_values)
        .collect();
    values.extend(
        registries
            .into_iter()
            .filter_map(|registry| match registry.spec {
                Spec::Registry(spec) => Some(spec.token),
                _ => None,
            }),
    );
    for bytes in blobs {
        // A file this host cannot open puts no value in any container either.
        let Some(Ok(file)) = crate::manifest::sops::parse(&bytes) else {
            continue;
        };
        let Ok(plain) = keyring.open(&file) else {
            continue;
        };
        if let Ok(env) = plain.env() {
            values.extend(env.into_iter().map(|(_, value)| value));
        }
    }
    Ok(Masker::new(values))
}

/// Whether `container` belongs to the query's resource and selection.
fn selected(container_labels: &BTreeMap<String, String>, name: &str, query: &LogQuery) -> bool {
    let label = |key: &str| container_labels.get(key).map(String::as_str);
    let release_name = format!("{}-release", query.name);
    if label(labels::SCOPE) != Some(query.scope.as_str())
        || !(label(labels::NAME) == Some(query.name.as_str())
            || label(labels::NAME) == Some(release_name.as_str()))
    {
        return false;
    }
    if let Some(replica) = &query.replica
        && name != replica
        && label(labels::REPLICA_ID) != Some(replica.as_str())
    {
        return false;
    }
    if let Some(release) = query.release
        && label(labels::RELEASE_ID) != Some(release.to_string().as_str())
    {
        return false;
    }
    true
}

/// Streams the query's containers into `sender` until they end (or, followed, until the
/// stream's reader is gone).
async fn stream<R: Runtime>(
    runtime: Arc<R>,
    agent_id: String,
    query: LogQuery,
    masker: Arc<Masker>,
    sender: mpsc::Sender<LogItem>,
) {
    let scope_filter = [
        (labels::AGENT, agent_id.as_str()),
        (labels::SCOPE, query.scope.as_str()),
    ];
    // Subscribed before the list, so a container starting in between is not missed.
    let mut events = query.follow.then(|| runtime.events(&scope_filter));
    let listed = match runtime.list(&scope_filter).await {
        Ok(listed) => listed,
        Err(error) => {
            let note = format!("cannot list the containers: {}", escape(&error.to_string()));
            let _ = sender.send(LogItem::Note(note)).await;
            return;
        }
    };
    let mut containers: Vec<Container> = listed
        .into_iter()
        .filter(|container| selected(&container.labels, &container.name, &query))
        .collect();
    containers.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    if containers.is_empty() && !query.follow {
        let note = format!(
            "no container of {}/{} on this host",
            escape(&query.scope),
            escape(&query.name)
        );
        let _ = sender.send(LogItem::Note(note)).await;
        return;
    }
    let options = LogOptions {
        since: query.since,
        tail: query.tail,
        follow: query.follow,
    };
    let mut readers = tokio::task::JoinSet::new();
    // Being read, by id; and every id read so far (one that starts again is read from then).
    let mut reading: BTreeMap<String, String> = BTreeMap::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let join = |container: &Container,
                options: LogOptions,
                readers: &mut tokio::task::JoinSet<String>,
                reading: &mut BTreeMap<String, String>,
                seen: &mut BTreeSet<String>| {
        if reading.contains_key(&container.id) {
            return true;
        }
        if reading.len() >= MAX_CONTAINERS {
            return false;
        }
        reading.insert(container.id.clone(), container.name.clone());
        seen.insert(container.id.clone());
        readers.spawn(read(
            Arc::clone(&runtime),
            container.id.clone(),
            container.name.clone(),
            options,
            Arc::clone(&masker),
            sender.clone(),
        ));
        true
    };
    for container in &containers {
        // Followed, a stopped container's history is shown; it then leaves at once.
        if !join(container, options, &mut readers, &mut reading, &mut seen) {
            let note = format!("more than {MAX_CONTAINERS} containers: the rest is not shown");
            let _ = sender.send(LogItem::Note(note)).await;
            break;
        }
    }
    let Some(events) = events.as_mut() else {
        while readers.join_next().await.is_some() {}
        return;
    };
    loop {
        tokio::select! {
            ended = readers.join_next(), if !readers.is_empty() => {
                if let Some(Ok(id)) = ended
                    && let Some(name) = reading.remove(&id)
                {
                    let note = format!("{} left", escape(&name));
                    if sender.send(LogItem::Note(note)).await.is_err() {
                        return;
                    }
                }
            }
            event = events.next() => {
                let Some(Ok(event)) = event else {
                    let _ = sender
                        .send(LogItem::Note("the engine's event stream ended".to_owned()))
                        .await;
                    return;
                };
                if event.action != "start"
                    || !selected(&event.labels, &event.name, &query)
                    || reading.contains_key(&event.id)
                {
                    continue;
                }
                // A container seen before restarted: its output from now on.
                let since = seen
                    .contains(&event.id)
                    .then(crate::store::now_unix);
                let container = Container {
                    id: event.id.clone(),
                    name: event.name.clone(),
                    image: String::new(),
                    labels: event.labels.clone(),
                    state: ContainerState::Running,
                };
                if reading.len() >= MAX_CONTAINERS {
                    continue;
                }
                // Said before its first line.
                let note = format!("{} joined", escape(&container.name));
                if sender.send(LogItem::Note(note)).await.is_err() {
                    return;
                }
                let options = LogOptions {
                    since,
                    tail: None,
                    follow: true,
                };
                join(&container, options, &mut readers, &mut reading, &mut seen);
            }
            () = sender.closed() => return,
        }
    }
}

/// Reads one container's output into `sender` as shown lines; its id when the output ends.
async fn read<R: Runtime>(
    runtime: Arc<R>,
    id: String,
    name: String,
    options: LogOptions,
    masker: Arc<Masker>,
    sender: mpsc::Sender<LogItem>,
) -> String {
    let mut chunks = runtime.log_stream(&id, options);
    let mut splitter = Splitter::default();
    let source = escape(&name).into_owned();
    loop {
        let chunk = tokio::select! {
            chunk = chunks.next() => chunk,
            () = sender.closed() => return id,
        };
        match chunk {
            Some(Ok(bytes)) => {
                for (line, cut) in splitter.push(&bytes) {
                    let shown = Shown {
                        source: source.clone(),
                        text: masker.show(&line, cut),
                    };
                    if sender.send(LogItem::Line(shown)).await.is_err() {
                        return id;
                    }
                }
            }
            Some(Err(error)) => {
                let note = format!("{source}: {}", escape(&error.to_string()));
                let _ = sender.send(LogItem::Note(note)).await;
                break;
            }
            None => break,
        }
    }
    if let Some((line, cut)) = splitter.finish() {
        let shown = Shown {
            source,
            text: masker.show(&line, cut),
        };
        let _ = sender.send(LogItem::Line(shown)).await;
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(scope: &str, name: &str, replica: &str, release: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::SCOPE.to_owned(), scope.to_owned()),
            (labels::NAME.to_owned(), name.to_owned()),
            (labels::REPLICA_ID.to_owned(), replica.to_owned()),
            (labels::RELEASE_ID.to_owned(), release.to_owned()),
        ])
    }

    #[test]
    fn a_query_selects_the_resource_its_hooks_one_replica_or_one_release() {
        let all = LogQuery {
            scope: "s".into(),
            name: "web".into(),
            ..LogQuery::default()
        };
        assert!(selected(&labelled("s", "web", "a1", "3"), "s-web.a1", &all));
        assert!(selected(
            &labelled("s", "web-release", "", "3"),
            "s-web-release-3",
            &all
        ));
        assert!(!selected(
            &labelled("s", "api", "a1", "3"),
            "s-api.a1",
            &all
        ));
        assert!(!selected(
            &labelled("t", "web", "a1", "3"),
            "t-web.a1",
            &all
        ));
        let replica = LogQuery {
            replica: Some("a1".into()),
            ..all.clone()
        };
        assert!(selected(&labelled("s", "web", "a1", "3"), "x", &replica));
        assert!(!selected(&labelled("s", "web", "b2", "3"), "x", &replica));
        let by_name = LogQuery {
            replica: Some("s-web.b2".into()),
            ..all.clone()
        };
        assert!(selected(
            &labelled("s", "web", "b2", "3"),
            "s-web.b2",
            &by_name
        ));
        let release = LogQuery {
            release: Some(4),
            ..all
        };
        assert!(!selected(&labelled("s", "web", "a1", "3"), "x", &release));
        assert!(selected(&labelled("s", "web", "a1", "4"), "x", &release));
    }
}
