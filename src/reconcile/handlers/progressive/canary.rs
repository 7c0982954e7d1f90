//! A deployment's canary rollout (`canary {}`), one pass at a time: reads the stored step
//! (`store::RolloutState`), asks the pure step machine (`plan::canary::decide`) for the next
//! move, records it, and tells the replicated pass what to do with the host: bring the step's
//! canary replicas up beside the stable ones, hold (a pause, an analysis in flight), abort,
//! or hand over to the ordinary rollout (at 100 %).
//!
//! Invariants: a pass never waits (a pause is a `RequeueAfter`, an analysis is a task on the
//! reconciler's tracker whose end requeues the key); the step is in the store before its
//! replicas are created, so an agent restarted mid-canary resumes that step with that share
//! and never more; an analysis's verdict is recorded only for the release and step it
//! measured; an `http` analysis's requests go through the ingress proxy to the canary's own
//! route (a random per-agent header value, `router::split`), or straight to the canary
//! replicas when no ingress routes the deployment; a `prometheus` URL only where
//! `--allow-url-host` lets requests of a manifest go (`Outbound`, as `on_deploy` webhooks).

use std::time::Duration;

use serde_json::{Value, json};

use super::{Event, IsCurrent, Move, RECHECK, Subject, count, hold, save, sides, state_of};
use crate::manifest::spec::rollout::{Analysis, Canary, canary_replicas};
use crate::model::ResourceKey;
use crate::reconcile::handlers::replicas::Observed;
use crate::reconcile::plan::canary::{
    self as plan, AnalysisProgress, CanaryDecision, Sample, StepState,
};
use crate::reconcile::router::routes::CANARY_HEADER;
use crate::reconcile::run::action::Action;
use crate::reconcile::run::timer::What;
use crate::reconcile::{context::Ctx, context::blocking, error::Result};
use crate::runtime::{Container, Runtime};
use crate::store::{RolloutPhase, RolloutState, now_unix};

/// The strategy's name in the store.
const CANARY: &str = "canary";
/// One request of an `http` analysis gives up after this long (counted as failed).
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// One Prometheus query gives up after this long.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// An analysis waiting for the ingress proxy's listener looks again this soon.
const PROXY_RECHECK: Duration = Duration::from_secs(1);
/// Most bytes of a Prometheus answer read.
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// The id of the analysis task of `key`'s release `release` at `step` (`Runs::attach`).
fn analysis_id(key: &ResourceKey, release: &str, step: u32) -> String {
    format!("analysis:{key}:{release}:{step}")
}

/// Where `state`'s step's analysis is: running (a task is attached), judged for this step
/// (the recorded values name the step), or not started.
fn progress<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey, state: &RolloutState) -> AnalysisProgress {
    if ctx
        .runs
        .attached()
        .contains(&analysis_id(key, &state.release, state.step))
    {
        return AnalysisProgress::Running;
    }
    let judged_step = state.analysis["step"].as_u64();
    if judged_step != Some(u64::from(state.step)) {
        return AnalysisProgress::NotStarted;
    }
    match state.verdict.as_str() {
        "passed" => AnalysisProgress::Passed,
        "failed" => AnalysisProgress::Failed,
        _ => AnalysisProgress::NotStarted,
    }
}

/// The next move of `subject`'s canary rollout by `canary`, from what `observed` saw of its
/// replicas (`is_current`: the release's version).
pub(super) async fn drive<R: Runtime>(
    ctx: &Ctx<R>,
    subject: &Subject<'_>,
    canary: &Canary,
    observed: &Observed,
    is_current: &IsCurrent<'_>,
) -> Result<Move> {
    let Subject {
        key,
        n_replicas,
        port,
        ..
    } = *subject;
    let (current, stable, current_ready, stable_ready) = sides(observed, is_current);
    let first = canary.steps.first().map(|step| step.weight);
    let fresh = |state: &mut RolloutState| {
        if let Some(weight) = first {
            state.share = weight;
            state.canary_replicas = count(canary_replicas(weight, n_replicas));
        }
    };
    let Some(mut state) = state_of(ctx, subject, CANARY, stable_ready, fresh).await? else {
        return Ok(Move::Off);
    };
    // The canary's replicas, for its own route through the ingress (`router::split`).
    let mut names: Vec<String> = current.iter().map(|c| c.name.clone()).collect();
    names.sort_unstable();
    if !state.phase.is_final() && state.green != names {
        state.green = names;
        save(ctx, &state, None).await?;
        ctx.router.wake();
    }
    // Aborted, but the release still in progress (the pass that aborted was cut short).
    if state.phase == RolloutPhase::Aborted {
        return Ok(Move::Abort {
            reason: format!("canary aborted at {} %", state.share),
        });
    }
    // A few decisions follow one another in one pass (an advance, then the next step's
    // scale); bounded by the steps.
    for _ in 0..=canary.steps.len() + 1 {
        let wanted = state.canary_replicas as usize;
        let seen = plan::Observed {
            canary_ready: current.len() >= wanted && current_ready >= wanted && wanted > 0,
            canary_failed: false,
            analysis: progress(ctx, key, &state),
            now: now_unix(),
        };
        let step_state = StepState {
            step: state.step,
            phase: state.phase,
            paused_until: state.paused_until,
            promote_requested: state.promote_requested,
            abort_requested: state.abort_requested,
        };
        match plan::decide(canary, n_replicas, step_state, seen) {
            CanaryDecision::Scale {
                share,
                canary_replicas,
            } => {
                if state.share != share || state.canary_replicas as usize != canary_replicas {
                    state.share = share;
                    state.canary_replicas = count(canary_replicas);
                    save(ctx, &state, None).await?;
                }
                let message = format!(
                    "{}; bringing its replicas up",
                    step_line(&state, canary, stable.len())
                );
                return Ok(Move::Scale {
                    canary: canary_replicas,
                    message,
                });
            }
            CanaryDecision::BeginPause { until } => {
                state.phase = RolloutPhase::Paused;
                state.paused_until = until;
                let message = match until {
                    Some(until) => format!(
                        "paused at {} % for {} s",
                        state.share,
                        until.saturating_sub(now_unix())
                    ),
                    None => format!(
                        "paused at {} % until `voodu-agent promote {}/{}`",
                        state.share, key.scope, key.name
                    ),
                };
                save(ctx, &state, Some(Event::Paused(message.clone()))).await?;
                return Ok(hold(
                    until,
                    format!("{}; {message}", step_line(&state, canary, stable.len())),
                ));
            }
            CanaryDecision::Wait { until } => {
                return Ok(hold(
                    until,
                    format!(
                        "{}; paused{}",
                        step_line(&state, canary, stable.len()),
                        match until {
                            Some(_) => String::new(),
                            None =>
                                format!(" until `voodu-agent promote {}/{}`", key.scope, key.name),
                        }
                    ),
                ));
            }
            CanaryDecision::Analyse => {
                if state.phase == RolloutPhase::Paused {
                    state.phase = RolloutPhase::Progressing;
                    save(ctx, &state, None).await?;
                }
                let Some(analysis) = canary.analysis.clone() else {
                    // `decide` asks for an analysis only when there is one.
                    return Ok(Move::Off);
                };
                let Some(reach) = reach(ctx, key, &current, port).await? else {
                    return Ok(Move::Hold {
                        action: Action::RequeueAfter(PROXY_RECHECK),
                        message: format!(
                            "{}; the analysis waits for the ingress proxy",
                            step_line(&state, canary, stable.len())
                        ),
                    });
                };
                start_analysis(ctx, key, &state, analysis, reach);
                return Ok(Move::Hold {
                    action: Action::RequeueAfter(RECHECK),
                    message: format!(
                        "{}; analysing the canary",
                        step_line(&state, canary, stable.len())
                    ),
                });
            }
            CanaryDecision::AwaitAnalysis => {
                return Ok(Move::Hold {
                    action: Action::RequeueAfter(RECHECK),
                    message: format!(
                        "{}; analysing the canary",
                        step_line(&state, canary, stable.len())
                    ),
                });
            }
            CanaryDecision::Advance { step } => {
                state.step = step;
                state.phase = RolloutPhase::Progressing;
                state.paused_until = None;
                state.promote_requested = false;
                if let Some(next) = canary.steps.get(step as usize) {
                    state.share = next.weight;
                    state.canary_replicas = count(canary_replicas(next.weight, n_replicas));
                }
                state.started = now_unix();
                save(ctx, &state, None).await?;
            }
            CanaryDecision::Complete | CanaryDecision::Done => {
                if !state.phase.is_final() {
                    state.phase = RolloutPhase::Promoted;
                    state.share = 100;
                    state.canary_replicas = count(n_replicas);
                    state.paused_until = None;
                    let message = "at 100 %: the new release replaces the stable replicas";
                    save(ctx, &state, Some(Event::Promoted(message.to_owned()))).await?;
                }
                return Ok(Move::Off);
            }
            CanaryDecision::Abort { reason } => {
                state.phase = RolloutPhase::Aborted;
                state.abort_requested = false;
                state.paused_until = None;
                let reason = format!("canary aborted at {} %: {reason}", state.share);
                save(ctx, &state, Some(Event::Aborted(reason.clone()))).await?;
                return Ok(Move::Abort { reason });
            }
        }
    }
    Ok(Move::Hold {
        action: Action::RequeueAfter(RECHECK),
        message: step_line(&state, canary, stable.len()),
    })
}

/// `canary step 1/3: 10 % by replicas (1 new beside 9 stable)`.
fn step_line(state: &RolloutState, canary: &Canary, stable: usize) -> String {
    format!(
        "canary step {}/{}: {} % by replicas ({} new beside {stable} stable)",
        state.step + 1,
        canary.steps.len(),
        state.share,
        state.canary_replicas
    )
}

/// Where an `http` analysis sends its requests.
enum Reach {
    /// Through the ingress proxy's HTTP listener, to the canary's own route (`Host` of an
    /// ingress of the deployment, `CANARY_HEADER: token`): the canary only, as clients
    /// reach it.
    Ingress {
        proxy: String,
        host: String,
        token: String,
    },
    /// No ingress routes the deployment (or the proxy is off): straight to the canary
    /// replicas' addresses on the shared network.
    Replicas { addresses: Vec<String>, port: u16 },
}

/// How the analysis reaches `key`'s canary (`current`, serving on `port`): through the
/// ingress when the router serves the canary's own route, else straight to its replicas;
/// `None` while the proxy's listener is not known yet.
async fn reach<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    current: &[&Container],
    port: u16,
) -> Result<Option<Reach>> {
    if ctx.options.ingress.is_some()
        && let Ok(table) = crate::reconcile::router::current_table(ctx).await
        && let Some(view) = table.ingresses.iter().find(|view| {
            view.key.scope == key.scope && view.service == key.name && view.match_header.is_some()
        })
    {
        // The proxy's listener, once the router reported it (a restarted agent's first
        // passes come before its router's: the analysis waits for it).
        let proxy = ctx
            .router
            .report()
            .proxy
            .as_ref()
            .and_then(|proxy| proxy.http.clone())
            .map(|http| http.replacen("0.0.0.0:", "127.0.0.1:", 1));
        return Ok(proxy.map(|proxy| Reach::Ingress {
            proxy,
            host: view.host.clone(),
            token: ctx.memory.canary_token.value().to_owned(),
        }));
    }
    let names: Vec<String> = current.iter().map(|c| c.name.clone()).collect();
    let owner = key.clone();
    let rows = blocking(&ctx.store, move |store| store.readiness(&owner)).await?;
    let addresses = rows
        .into_iter()
        .filter(|row| row.ready && !row.address.is_empty() && names.contains(&row.container))
        .map(|row| row.address)
        .collect();
    Ok(Some(Reach::Replicas { addresses, port }))
}

/// Starts the step's analysis on the reconciler's tracker (unless it runs): it measures,
/// records the verdict for this release and step, and queues the key.
fn start_analysis<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    state: &RolloutState,
    analysis: Analysis,
    reach: Reach,
) {
    let id = analysis_id(key, &state.release, state.step);
    let runs = ctx.runs.clone();
    let timer = ctx.timer.clone();
    let store = ctx.store.clone();
    let shutdown = ctx.shutdown.clone();
    let outbound = ctx.options.webhooks.clone();
    let (key, release, step) = (key.clone(), state.release.clone(), state.step);
    let task_id = id.clone();
    ctx.runs.attach(&id, async move {
        let measured = tokio::select! {
            () = shutdown.cancelled() => None,
            values = measure(&timer, &outbound, &analysis, &reach) => Some(values),
        };
        if let Some((passed, values)) = measured {
            let recorded = tokio::task::spawn_blocking(move || {
                let Some(mut state) = store.rollout_state(&key.scope, &key.name)? else {
                    return Ok(key);
                };
                if state.release != release || state.step != step || state.phase.is_final() {
                    return Ok(key);
                }
                state.verdict = if passed { "passed" } else { "failed" }.to_owned();
                let mut values = values;
                values["step"] = json!(step);
                state.analysis = values;
                store.save_rollout(&state, None)?;
                Ok::<_, crate::store::Error>(key)
            })
            .await;
            match recorded {
                Ok(Ok(key)) => timer.requeue(key),
                Ok(Err(error)) => tracing::warn!(%error, "canary analysis: cannot record it"),
                Err(error) => tracing::warn!(%error, "canary analysis: cannot record it"),
            }
        }
        runs.detach(&task_id);
    });
}

/// One sample's status; `None` when no answer came within `SAMPLE_TIMEOUT`. Through the
/// ingress, a connection the proxy closed or reset before answering is tried once more at
/// once: Caddy 2.6.2 drops the connections that arrive while it loads a config (README,
/// "Progressive delivery"), and the agent's own config loads are no verdict on the canary.
/// A status, a refusal or a timeout counts as it came.
async fn sample_status(request: reqwest::RequestBuilder, through_proxy: bool) -> Option<u16> {
    let again = through_proxy.then(|| request.try_clone()).flatten();
    match send(request).await {
        Err(true) => send(again?).await.ok(),
        answered => answered.ok(),
    }
}

/// One request's status within `SAMPLE_TIMEOUT`; without one, whether its connection was
/// closed or reset before any answer (not refused, not timed out).
async fn send(request: reqwest::RequestBuilder) -> Result<u16, bool> {
    match tokio::time::timeout(SAMPLE_TIMEOUT, request.send()).await {
        Ok(Ok(response)) => Ok(response.status().as_u16()),
        Ok(Err(error)) => Err(dropped_unanswered(&error)),
        Err(_) => Err(false),
    }
}

/// Whether a request failed because its connection was closed or reset before any answer
/// (a broken pipe too: the proxy closed it while the request was still being written).
fn dropped_unanswered(error: &reqwest::Error) -> bool {
    let first: &(dyn std::error::Error + 'static) = error;
    std::iter::successors(Some(first), |cause| cause.source()).any(|cause| {
        cause
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
            || cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                )
            })
    })
}

/// Runs every check `analysis` names, the `http` one straight to the canary replicas: whether
/// all passed, and the values measured (with the step, for `progress`).
async fn measure(
    timer: &crate::reconcile::run::timer::Timer,
    outbound: &crate::assets::url_guard::Outbound,
    analysis: &Analysis,
    reach: &Reach,
) -> (bool, Value) {
    let mut values = serde_json::Map::new();
    let mut passed = true;
    if let Some(http) = &analysis.http {
        let client = crate::reconcile::observers::probes::http_client();
        let samples = http.samples.max(1) as usize;
        let gap = analysis.interval() / u32::try_from(samples).unwrap_or(u32::MAX);
        let mut seen = Vec::with_capacity(samples);
        for index in 0..samples {
            if index > 0 {
                timer.sleep(What::Unit, gap).await;
            }
            let request = match reach {
                Reach::Ingress { proxy, host, token } => client
                    .get(format!("http://{proxy}{}", http.path))
                    .header(reqwest::header::HOST, host.as_str())
                    .header(CANARY_HEADER, token.as_str()),
                Reach::Replicas { addresses, port } => {
                    let Some(address) = addresses.get(index % addresses.len().max(1)) else {
                        break;
                    };
                    client.get(format!("http://{address}:{port}{}", http.path))
                }
            };
            let start = tokio::time::Instant::now();
            let through_proxy = matches!(reach, Reach::Ingress { .. });
            let status = sample_status(request, through_proxy).await;
            seen.push(Sample {
                status,
                latency: start.elapsed(),
            });
            // Enough failures that the rest cannot pass: judged now.
            let errors = seen
                .iter()
                .filter(|sample| sample.status.is_none_or(|status| status >= 500))
                .count();
            if errors * 100 > http.max_error_percent as usize * samples {
                break;
            }
        }
        let mut judged = plan::judge_http(http, &seen);
        judged.values["via"] = json!(match reach {
            Reach::Ingress { .. } => "ingress",
            Reach::Replicas { .. } => "replicas",
        });
        passed &= judged.passed;
        values.insert("http".to_owned(), judged.values);
    }
    if passed && let Some(prometheus) = &analysis.prometheus {
        let mut measurements = Vec::new();
        let mut error = None;
        for index in 0..prometheus.count() {
            if index > 0 {
                timer.sleep(What::Unit, prometheus.interval()).await;
            }
            match query(outbound, &prometheus.url, &prometheus.query).await {
                Ok(found) => measurements.push(found),
                Err(why) => {
                    error = Some(why);
                    break;
                }
            }
        }
        let mut judged = plan::judge_prometheus(prometheus, &measurements);
        if let Some(error) = error {
            judged.passed = false;
            judged.values["error"] = json!(crate::model::text::escape(&error));
        }
        passed &= judged.passed;
        values.insert("prometheus".to_owned(), judged.values);
    }
    (passed, Value::Object(values))
}

/// One instant query (`/api/v1/query`): the values of its answer.
async fn query(
    outbound: &crate::assets::url_guard::Outbound,
    base: &str,
    text: &str,
) -> std::result::Result<Vec<f64>, String> {
    let mut url = reqwest::Url::parse(&format!("{}/api/v1/query", base.trim_end_matches('/')))
        .map_err(|error| format!("prometheus url {base}: {error}"))?;
    url.query_pairs_mut().append_pair("query", text);
    outbound
        .check(url.as_str())
        .map_err(|error| error.to_string())?;
    let client = outbound
        .client(QUERY_TIMEOUT)
        .map_err(|error| error.to_string())?;
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|error| format!("prometheus at {base}: {error}"))?;
    let mut body = Vec::new();
    let mut response = response;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| format!("prometheus at {base}: {error}"))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "prometheus at {base}: the answer is larger than {MAX_ANSWER_BYTES} bytes"
            ));
        }
    }
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|error| format!("prometheus at {base}: not JSON: {error}"))?;
    plan::prometheus_values(&answer)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::sample_status;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A loopback server that closes its first `drop_first` connections unanswered (after
    /// reading the request), then answers `status` to each: its address, and the task that
    /// returns how many connections it saw once `stop` is sent.
    async fn server(
        drop_first: usize,
        status: u16,
    ) -> std::io::Result<(
        String,
        tokio::task::JoinHandle<usize>,
        tokio::sync::oneshot::Sender<()>,
    )> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut seen = 0;
            loop {
                let mut stream = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => return seen,
                    },
                    _ = &mut stopped => return seen,
                };
                seen += 1;
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).await;
                if seen > drop_first {
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
            }
        });
        Ok((address, task, stop))
    }

    /// `samples` samples of `GET /` from a `server(drop_first, status)`, one after another;
    /// then how many connections the server saw.
    async fn sample_and_count(
        drop_first: usize,
        status: u16,
        through_proxy: bool,
        samples: usize,
    ) -> Result<(Vec<Option<u16>>, usize), Box<dyn std::error::Error>> {
        let client = crate::reconcile::observers::probes::http_client();
        let (address, task, stop) = server(drop_first, status).await?;
        let mut got = Vec::new();
        for _ in 0..samples {
            let request = client.get(format!("http://{address}/"));
            got.push(sample_status(request, through_proxy).await);
        }
        let _ = stop.send(());
        Ok((got, task.await?))
    }

    #[tokio::test]
    async fn through_the_proxy_a_dropped_connection_is_tried_once_more() -> TestResult {
        let (got, seen) = sample_and_count(1, 200, true, 1).await?;
        assert_eq!(got, [Some(200)]);
        assert_eq!(seen, 2, "one drop, one try more");
        Ok(())
    }

    #[tokio::test]
    async fn a_second_drop_or_a_direct_sample_counts_as_failed_and_a_status_as_it_came()
    -> TestResult {
        let (got, seen) = sample_and_count(2, 200, true, 2).await?;
        assert_eq!(got, [None, Some(200)], "dropped twice, then answered");
        assert_eq!(seen, 3);
        let (got, seen) = sample_and_count(1, 200, false, 1).await?;
        assert_eq!(got, [None], "no retry straight to the replicas");
        assert_eq!(seen, 1);
        let (got, seen) = sample_and_count(0, 500, true, 1).await?;
        assert_eq!(got, [Some(500)], "a 500 is not retried");
        assert_eq!(seen, 1);
        Ok(())
    }
}
