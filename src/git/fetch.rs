//! Fetching into the mirror: the ref listing, the negotiation and the pack, through gix's
//! protocol layer. `gix::remote::Connection::prepare_fetch` cannot ask for a partial pack
//! (gix 0.90 has no fetch filter), so this module drives `gix::protocol::fetch` itself and
//! asks the server to leave out blobs no reader of the agent would read (git's partial clone,
//! `filter blob:limit=N`): a manifest over `MAX_MANIFEST_BYTES`, a `file()` over
//! `--max-file-size`. Such a blob is never downloaded, written, inflated or hashed, so a
//! commit adding a 150 MB file costs its trees, not its blob. A server that does not offer
//! `filter` (an upload-pack without `uploadpack.allowFilter`, Gitea's default) sends every
//! blob, as a plain fetch does. A repository on this host is served by a `git upload-pack`
//! the agent starts with filters allowed (`upload_pack.rs`).
//!
//! The mirror remembers the limit it was fetched with (the `blob-limit` file beside its
//! `HEAD`): every blob smaller than it is present, and a blob the mirror lacks is one the
//! fetch left out ([`BlobLimit::of`], read by `tree::read_blob`). No file: a complete mirror.
//!
//! Invariants: the limit is written before a filtered pack is received, so a mirror never
//! lacks a blob its file does not account for; a source whose readers need larger blobs than
//! its mirror holds starts the mirror again (`Source::open_mirror_for_fetch`) rather than
//! reading around holes; the mirror's limit never shrinks (a fetch asks with the larger of
//! the two), so two readers with different limits do not refetch in turn; refs move only
//! after the pack is on disk, indexed. A pack that cannot be indexed because it refers to a
//! blob the mirror left out ([`Failure::LeftOutBase`]: git sent a file shrunk below the limit
//! as a change against its larger self) makes `Source::negotiate` fetch the mirror anew, once.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use gix::protocol::fetch::{Arguments, Negotiate, RefMap, negotiate};
use gix::protocol::transport::client::blocking_io::Transport;

/// The file in the mirror holding the limit it is fetched with.
const FILE: &str = "blob-limit";

/// The size from which a fetch leaves blobs out: every blob smaller than it is fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct BlobLimit(u64);

impl BlobLimit {
    /// The limit that fetches every blob a reader of at most `largest_read` bytes reads;
    /// `None` when that is every blob.
    pub(super) fn for_reads(largest_read: u64) -> Option<BlobLimit> {
        largest_read.checked_add(1).map(BlobLimit)
    }

    /// The smallest blob the fetch leaves out, in bytes.
    pub(super) fn bytes(self) -> u64 {
        self.0
    }

    /// The limit the mirror at `git_dir` was fetched with; `None` for a complete mirror.
    pub(super) fn of(git_dir: &Path) -> Option<BlobLimit> {
        let text = std::fs::read_to_string(git_dir.join(FILE)).ok()?;
        text.trim().parse().ok().map(BlobLimit)
    }

    /// Records that the mirror at `git_dir` is fetched with this limit from now on.
    fn record(self, git_dir: &Path) -> std::io::Result<()> {
        if BlobLimit::of(git_dir) == Some(self) {
            return Ok(());
        }
        let path = git_dir.join(FILE);
        let staged = git_dir.join(format!("{FILE}.new"));
        std::fs::write(&staged, format!("{}\n", self.0))?;
        std::fs::rename(staged, path)
    }
}

/// What one fetch asks for.
pub(super) struct Request<'a> {
    pub(super) url: &'a str,
    pub(super) refspecs: &'a [String],
    /// How the remote is reached.
    pub(super) via: Via,
    /// The blobs the mirror's readers read; `None`: every blob.
    pub(super) blob_limit: Option<BlobLimit>,
}

/// How a fetch reaches its remote.
pub(super) enum Via {
    /// http(s): the agent's own client (`http.rs`) under gix's smart-HTTP transport.
    Http(super::http::Client),
    /// ssh, git, a path: gix's transport with the repository's options for it, if any (ssh:
    /// the command), set before the handshake.
    Gix(Option<Box<dyn std::any::Any>>),
}

/// Why a fetch failed: gix's error, or the caller's `decide`.
pub(super) enum Failure<E> {
    Gix(gix::Error),
    Decide(E),
    /// The server sent an object as a change against a blob the mirror left out (a thin pack:
    /// it takes the mirror to hold every object of the commits it has). The pack cannot be
    /// indexed; a mirror fetched anew has no such commits, so its packs never refer to one.
    LeftOutBase(gix::Error),
}

impl<E> From<gix::Error> for Failure<E> {
    fn from(error: gix::Error) -> Failure<E> {
        Failure::Gix(error)
    }
}

/// Lists the remote's refs matching `request.refspecs`, lets `decide` look at them, and when
/// it says so receives a pack of what the mirror lacks (blobs under the limit) and moves the
/// mirror's refs to the remote's. Blocking.
pub(super) fn fetch<T, E>(
    repo: &gix::Repository,
    request: Request<'_>,
    authenticate: impl FnMut(
        gix::credentials::helper::Action,
    ) -> gix::Result<Option<gix::credentials::protocol::Outcome>>,
    interrupt: &AtomicBool,
    decide: impl FnOnce(&[gix::protocol::handshake::Ref]) -> Result<(T, bool), E>,
) -> Result<T, Failure<E>> {
    use gix::error::ResultExt as _;
    let remote = repo
        .remote_at(request.url)
        .or_raise(|| gix::error::message("invalid remote URL"))?
        .with_refspecs(
            request.refspecs.iter().map(String::as_str),
            gix::remote::Direction::Fetch,
        )
        .or_raise(|| gix::error::message("invalid refspec"))?;
    let refspecs = remote.refspecs(gix::remote::Direction::Fetch).to_vec();
    // A local repository's path, checked and resolved (a work tree's `.git`) as gix does.
    let (url, version) = remote.sanitized_url_and_version(gix::remote::Direction::Fetch)?;
    let mut local;
    let mut http;
    let mut connection;
    let mut transport: &mut dyn Transport = match request.via {
        _ if url.scheme == gix::url::Scheme::File => {
            local = super::upload_pack::UploadPack::new(gix::path::from_bstring(url.path)?);
            &mut local
        }
        Via::Http(client) => {
            http = gix::protocol::transport::client::blocking_io::http::Transport::new_http(
                client, url, version, false,
            );
            &mut http
        }
        Via::Gix(options) => {
            connection = remote
                .connect(gix::remote::Direction::Fetch)
                .or_raise(|| gix::error::message("cannot connect"))?;
            let transport = &mut **connection.transport_mut();
            if let Some(options) = &options {
                transport
                    .configure(&**options)
                    .or_raise(|| gix::error::message("cannot configure the transport"))?;
            }
            transport
        }
    };
    let mut handshake = gix::protocol::handshake(
        &mut transport,
        gix::protocol::transport::Service::UploadPack,
        authenticate,
        Vec::new(),
        &mut gix::progress::Discard,
    )?;
    let context = gix::protocol::fetch::refmap::init::Context {
        fetch_refspecs: refspecs,
        extra_refspecs: Vec::new(),
    };
    let ref_map = handshake
        .prepare_lsrefs_or_extract_refmap(user_agent(), true, context)?
        .fetch_blocking(gix::progress::Discard, &mut transport, false)?;
    let (value, receive) = decide(&ref_map.remote_refs).map_err(Failure::Decide)?;
    if !receive {
        return Ok(value);
    }
    let _purge = super::memory::PromptPurge::start();
    let filter = request
        .blob_limit
        .filter(|_| server_filters(&handshake))
        .map(|limit| {
            limit
                .record(repo.path())
                .or_raise(|| gix::error::message("cannot record the mirror's blob limit"))
                .map(|()| limit)
        })
        .transpose()?;
    let mut negotiate = Negotiation {
        repo,
        graph: repo.revision_graph(None),
        negotiator: gix::negotiate::Algorithm::Consecutive.into_negotiator(),
        ref_map: &ref_map,
        filter,
    };
    let pack_dir = repo.objects.store_ref().path().join("pack");
    let partial = BlobLimit::of(repo.path()).is_some();
    let mut written = None;
    let mut left_out_base = false;
    let fetched = gix::protocol::fetch(
        &mut negotiate,
        |pack, progress, interrupt| {
            let bundle = gix::odb::pack::Bundle::write_to_directory(
                pack,
                Some(&pack_dir),
                progress,
                interrupt,
                Some(Box::new(repo.objects.clone())),
                repo.object_hash(),
                gix::odb::pack::bundle::write::Options::default(),
            )
            .inspect_err(|error| left_out_base = partial && error.is_not_found())
            .or_raise(|| gix::error::message("cannot write the received pack"))?;
            written = Some(bundle);
            Ok(true)
        },
        gix::progress::Discard,
        interrupt,
        gix::protocol::fetch::Context {
            handshake: &mut handshake,
            transport: &mut transport,
            user_agent: user_agent(),
            trace_packetlines: false,
        },
        gix::protocol::fetch::Options {
            shallow_file: repo.shallow_file()?,
            shallow: &gix::protocol::fetch::Shallow::NoChange,
            tags: gix::protocol::fetch::Tags::None,
            reject_shallow_remote: false,
        },
    );
    match fetched {
        Err(error) if left_out_base => return Err(Failure::LeftOutBase(error)),
        fetched => fetched?,
    };
    move_refs(repo, &ref_map)?;
    if let Some(keep) = written.and_then(|mut bundle| bundle.keep_path.take()) {
        std::fs::remove_file(&keep)
            .or_raise(|| gix::error::message("cannot remove the pack's .keep file"))?;
    }
    Ok(value)
}

/// Whether the server takes `filter` in a fetch (git's `uploadpack.allowFilter`).
fn server_filters(handshake: &gix::protocol::Handshake) -> bool {
    gix::protocol::Command::Fetch
        .default_features(handshake.server_protocol_version, &handshake.capabilities)
        .iter()
        .any(|(name, _)| *name == "filter")
}

/// How the agent names itself to the server (git's `agent` capability).
fn user_agent() -> gix::protocol::command::Feature {
    (
        "agent",
        Some(concat!("voodu-agent/", env!("CARGO_PKG_VERSION")).into()),
    )
}

/// Points each mapped local ref at the remote's object, when the mirror has it (all are
/// forced refspecs: `+src:dst`).
fn move_refs(repo: &gix::Repository, ref_map: &RefMap) -> gix::Result<()> {
    use gix::error::ResultExt as _;
    use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit};
    let mut edits = Vec::new();
    for mapping in &ref_map.mappings {
        let (Some(local), Some(id)) = (&mapping.local, mapping.remote.as_id()) else {
            continue;
        };
        if !repo.has_object(id) {
            continue;
        }
        edits.push(RefEdit {
            change: Change::Update {
                log: LogChange::default(),
                expected: PreviousValue::Any,
                new: gix::refs::Target::Object(id.to_owned()),
            },
            name: gix::refs::FullName::try_from(local.clone())
                .or_raise(|| gix::error::message("invalid local ref name"))?,
            deref: false,
        });
    }
    if !edits.is_empty() {
        repo.edit_references(edits)
            .or_raise(|| gix::error::message("cannot move the mirror's refs"))?;
    }
    Ok(())
}

/// gix's negotiation (the mirror's refs as haves, the remote's new tips as wants), plus the
/// blob filter.
struct Negotiation<'a> {
    repo: &'a gix::Repository,
    graph: gix::negotiate::Graph<'a, 'a>,
    negotiator: Box<dyn gix::negotiate::Negotiator>,
    ref_map: &'a RefMap,
    filter: Option<BlobLimit>,
}

impl Negotiate for Negotiation<'_> {
    fn mark_complete_and_common_ref(&mut self) -> gix::Result<negotiate::Action> {
        negotiate::mark_complete_and_common_ref(
            &self.repo.objects,
            &self.repo.refs,
            || Ok(std::iter::empty::<(gix::refs::file::Store, gix::OdbHandle)>()),
            self.negotiator.as_mut(),
            &mut self.graph,
            self.ref_map,
            &gix::protocol::fetch::Shallow::NoChange,
            negotiate::make_refmapping_ignore_predicate(
                gix::protocol::fetch::Tags::None,
                self.ref_map,
            ),
        )
    }

    fn add_wants(&mut self, arguments: &mut Arguments, remote_ref_target_known: &[bool]) -> bool {
        let wanted = negotiate::add_wants(
            &self.repo.objects,
            arguments,
            self.ref_map,
            remote_ref_target_known,
            &gix::protocol::fetch::Shallow::NoChange,
            negotiate::make_refmapping_ignore_predicate(
                gix::protocol::fetch::Tags::None,
                self.ref_map,
            ),
        );
        if let Some(limit) = self.filter
            && arguments.can_use_filter()
        {
            arguments.filter(&format!("blob:limit={}", limit.bytes()));
        }
        wanted
    }

    fn one_round(
        &mut self,
        state: &mut negotiate::one_round::State,
        arguments: &mut Arguments,
        previous_response: Option<&gix::protocol::fetch::Response>,
    ) -> gix::Result<(negotiate::Round, bool)> {
        negotiate::one_round(
            self.negotiator.as_mut(),
            &mut self.graph,
            state,
            arguments,
            previous_response,
        )
    }
}
