//! The `detail` of a resource in `status --json` (`GET /status`): one view type per kind,
//! made from the status row's typed detail (`store::Detail`).
//!
//! Invariants: this is the only place the document's `detail` is shaped; handlers fill
//! `store::Detail` and never build JSON. Fields are declared in alphabetical order, the order
//! the document has always printed them in, and the names are the document's API: a stored
//! field renamed keeps its name here.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::store::{self, Detail};

/// A resource's kind-specific state.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum DetailView {
    Deployment(DeploymentView),
    Statefulset(StatefulsetView),
    Asset(AssetView),
    Registry(RegistryView),
    Ingress(IngressView),
    Job(JobView),
    Cronjob(CronjobView),
}

impl DetailView {
    /// The view of a stored detail; `None` when the row has none.
    pub(crate) fn of(detail: Detail) -> Option<DetailView> {
        Some(match detail {
            Detail::None => return None,
            Detail::Deployment(detail) => DetailView::Deployment(DeploymentView {
                autoscaled_replicas: detail.autoscaled_replicas,
                ready_replicas: detail.ready_replicas,
                replicas: detail.replicas.into_iter().map(replica_view).collect(),
            }),
            Detail::Statefulset(detail) => DetailView::Statefulset(StatefulsetView {
                pods: detail.pods.into_iter().map(pod_view).collect(),
                ready_replicas: detail.ready_replicas,
                volumes: detail.volumes.into_iter().map(volume_view).collect(),
            }),
            Detail::Asset(detail) => DetailView::Asset(AssetView {
                files: crate::model::map_of(detail.files.into_iter().map(|(name, file)| {
                    let view = AssetFileView {
                        digest: file.digest,
                        size: file.size,
                        source: file.source,
                    };
                    (name, view)
                })),
                path: detail.path.display().to_string(),
                repaired: detail.repaired,
            }),
            Detail::Registry(detail) => DetailView::Registry(RegistryView {
                credentials: detail.credentials,
                helper: detail.helper,
                url: detail.url,
                username: detail.username,
            }),
            Detail::Ingress(detail) => DetailView::Ingress(ingress_view(detail)),
            Detail::Job(detail) => DetailView::Job(JobView {
                history: detail.history.into_iter().map(run_view).collect(),
                image: detail.image,
                last_run: detail.last_run.map(run_view),
                timeout: detail.timeout,
            }),
            Detail::Cronjob(detail) => DetailView::Cronjob(cronjob_view(detail)),
        })
    }

    /// Replicas ready, for the kinds that publish readiness.
    pub(crate) fn ready_replicas(&self) -> Option<usize> {
        match self {
            DetailView::Deployment(view) => Some(view.ready_replicas),
            DetailView::Statefulset(view) => Some(view.ready_replicas),
            _ => None,
        }
    }

    /// The autoscaler's replica count, while it sets one.
    pub(crate) fn autoscaled_replicas(&self) -> Option<usize> {
        match self {
            DetailView::Deployment(view) => view.autoscaled_replicas,
            _ => None,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct DeploymentView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) autoscaled_replicas: Option<usize>,
    pub(crate) ready_replicas: usize,
    pub(crate) replicas: Vec<ReplicaView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ReplicaView {
    pub(crate) current: bool,
    pub(crate) name: String,
    pub(crate) ready: bool,
    pub(crate) reason: String,
    pub(crate) state: String,
}

fn replica_view(replica: store::ReplicaDetail) -> ReplicaView {
    ReplicaView {
        current: replica.current,
        name: replica.name,
        ready: replica.ready,
        reason: replica.reason,
        state: replica.state,
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct StatefulsetView {
    pub(crate) pods: Vec<PodView>,
    pub(crate) ready_replicas: usize,
    pub(crate) volumes: Vec<VolumeView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PodView {
    pub(crate) current: bool,
    pub(crate) name: String,
    pub(crate) ordinal: Option<usize>,
    pub(crate) ready: bool,
    pub(crate) reason: String,
    pub(crate) state: String,
    pub(crate) volumes: Vec<String>,
}

fn pod_view(pod: store::PodDetail) -> PodView {
    PodView {
        current: pod.current,
        name: pod.name,
        ordinal: pod.ordinal,
        ready: pod.ready,
        reason: pod.reason,
        state: pod.state,
        volumes: pod.volumes,
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct VolumeView {
    pub(crate) claim: Option<String>,
    pub(crate) kept: bool,
    pub(crate) name: String,
    pub(crate) ordinal: Option<usize>,
}

fn volume_view(volume: store::VolumeDetail) -> VolumeView {
    VolumeView {
        claim: volume.claim,
        kept: volume.kept,
        name: volume.name,
        ordinal: volume.ordinal,
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct AssetView {
    pub(crate) files: BTreeMap<String, AssetFileView>,
    pub(crate) path: String,
    pub(crate) repaired: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AssetFileView {
    pub(crate) digest: String,
    pub(crate) size: u64,
    pub(crate) source: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct RegistryView {
    pub(crate) credentials: String,
    pub(crate) helper: String,
    pub(crate) url: String,
    pub(crate) username: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct IngressView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) health_check: Option<HealthCheckView>,
    pub(crate) host: String,
    pub(crate) live: bool,
    pub(crate) policy: String,
    pub(crate) port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) proxy: Option<ProxyView>,
    pub(crate) routes: Vec<RouteView>,
    pub(crate) service: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls: Option<TlsView>,
    pub(crate) upstreams: Vec<String>,
    pub(crate) url: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct HealthCheckView {
    pub(crate) interval: String,
    pub(crate) path: String,
    pub(crate) port: Option<u16>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProxyView {
    pub(crate) container: String,
    pub(crate) http: Option<String>,
    pub(crate) https: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct RouteView {
    pub(crate) path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) served_by: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) strip: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct TlsView {
    pub(crate) ask: String,
    pub(crate) email: String,
    pub(crate) on_demand: bool,
    pub(crate) provider: String,
}

fn ingress_view(detail: store::IngressDetail) -> IngressView {
    IngressView {
        health_check: detail.health_check.map(|check| HealthCheckView {
            interval: check.interval,
            path: check.path,
            port: check.port,
        }),
        host: detail.host,
        live: detail.live,
        policy: detail.policy,
        port: detail.port,
        proxy: detail.proxy.map(|proxy| ProxyView {
            container: proxy.container,
            http: proxy.http,
            https: proxy.https,
        }),
        routes: detail
            .routes
            .into_iter()
            .map(|route| RouteView {
                path: route.path,
                served_by: route.served_by,
                strip: route.strip,
            })
            .collect(),
        service: detail.service,
        tls: detail.tls.map(|tls| TlsView {
            ask: tls.ask,
            email: tls.email,
            on_demand: tls.on_demand,
            provider: tls.provider,
        }),
        upstreams: detail.upstreams,
        url: detail.url,
        warnings: detail.warnings,
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct JobView {
    pub(crate) history: Vec<RunView>,
    pub(crate) image: String,
    pub(crate) last_run: Option<RunView>,
    pub(crate) timeout: String,
}

/// One run of a job or cronjob; times are RFC 3339.
#[derive(Debug, Serialize)]
pub(crate) struct RunView {
    pub(crate) container: String,
    pub(crate) duration_seconds: Option<i64>,
    pub(crate) ended_at: Option<String>,
    pub(crate) error: String,
    pub(crate) exit_code: Option<i64>,
    pub(crate) logs_tail: String,
    pub(crate) run_id: String,
    pub(crate) spec_hash: String,
    pub(crate) started_at: String,
    pub(crate) status: String,
}

fn run_view(run: store::RunDetail) -> RunView {
    RunView {
        container: run.container,
        duration_seconds: run.duration_seconds,
        ended_at: run.ended_at,
        error: run.error,
        exit_code: run.exit_code,
        logs_tail: run.logs_tail,
        run_id: run.run_id,
        spec_hash: run.spec_hash,
        started_at: run.started_at,
        status: run.status,
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct CronjobView {
    pub(crate) concurrency_policy: String,
    pub(crate) history: Vec<RunView>,
    pub(crate) image: String,
    pub(crate) last_run: Option<RunView>,
    pub(crate) last_scheduled: Option<String>,
    pub(crate) next_run: Option<String>,
    pub(crate) next_run_local: Option<String>,
    pub(crate) schedule: String,
    pub(crate) skipped: Vec<SkipView>,
    pub(crate) suspend: bool,
    pub(crate) timezone: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct SkipView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last: Option<String>,
    pub(crate) message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) n_times: Option<u64>,
    pub(crate) reason: String,
    pub(crate) recorded_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) scheduled_at: Option<String>,
}

fn cronjob_view(detail: store::CronjobDetail) -> CronjobView {
    CronjobView {
        concurrency_policy: detail.concurrency_policy,
        history: detail.history.into_iter().map(run_view).collect(),
        image: detail.image,
        last_run: detail.last_run.map(run_view),
        last_scheduled: detail.last_scheduled,
        next_run: detail.next_run,
        next_run_local: detail.next_run_local,
        schedule: detail.schedule,
        skipped: detail
            .skipped
            .into_iter()
            .map(|skip| SkipView {
                first: skip.first,
                last: skip.last,
                message: skip.message,
                n_times: skip.n_times,
                reason: skip.reason,
                recorded_at: skip.recorded_at,
                scheduled_at: skip.scheduled_at,
            })
            .collect(),
        suspend: detail.suspend,
        timezone: detail.timezone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    /// The document prints each kind's detail as the stored JSON (the order and names
    /// `status --json` always had).
    #[test]
    fn each_kind_prints_its_stored_json() -> Result<(), serde_json::Error> {
        let cases = [
            (
                Kind::Deployment,
                r#"{"autoscaled_replicas":3,"ready_replicas":1,"replicas":[{"current":true,"name":"s-web.ab12","ready":true,"reason":"","state":"running"}]}"#,
            ),
            (
                Kind::Statefulset,
                r#"{"pods":[{"current":true,"name":"s-db-0","ordinal":0,"ready":false,"reason":"starting","state":"running","volumes":["v0"]}],"ready_replicas":0,"volumes":[{"claim":"data","kept":false,"name":"v0","ordinal":0}]}"#,
            ),
            (
                Kind::Asset,
                r#"{"files":{"a":{"digest":"ab","size":12,"source":"inline"}},"path":"/data/assets/s/site","repaired":[]}"#,
            ),
            (
                Kind::Registry,
                r#"{"credentials":"helper","helper":"pass","url":"ghcr.io","username":""}"#,
            ),
            (
                Kind::Ingress,
                r#"{"host":"shop.test","live":true,"policy":"round_robin","port":8080,"proxy":{"container":"c","http":"0.0.0.0:80","https":null},"routes":[{"path":"/"}],"service":"web","tls":{"ask":"","email":"","on_demand":false,"provider":"internal"},"upstreams":["10.0.0.2:8080"],"url":"https://shop.test"}"#,
            ),
            (
                Kind::Job,
                r#"{"history":[],"image":"busybox","last_run":null,"timeout":""}"#,
            ),
            (
                Kind::Cronjob,
                r#"{"concurrency_policy":"Forbid","history":[],"image":"busybox","last_run":null,"last_scheduled":null,"next_run":null,"next_run_local":null,"schedule":"@hourly","skipped":[{"message":"m","reason":"error","recorded_at":"t","scheduled_at":"t"}],"suspend":true,"timezone":"UTC"}"#,
            ),
        ];
        for (kind, stored) in cases {
            let view = DetailView::of(store::Detail::from_json(kind, stored));
            assert_eq!(serde_json::to_string(&view)?, stored, "{kind}");
        }
        assert!(DetailView::of(Detail::None).is_none());
        Ok(())
    }
}
