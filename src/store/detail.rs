//! The kind-specific part of a status row (`status.detail`): one typed struct per kind, stored
//! as the JSON object `status --json` shows under `detail`.
//!
//! Invariants: these types are the stored schema. Their JSON is what rows written before
//! they existed hold (fields in alphabetical order, as the `json!` objects they replace
//! printed them), so old rows read; a field is only ever added, with `#[serde(default)]`.
//! A row whose detail does not decode reads as `Detail::None`: it is a cache of what the
//! handler last observed, rewritten by the next pass, never a reason to fail a status read.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::model::Kind;

/// A status row's kind-specific detail.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Detail {
    /// Nothing beyond the common columns (stored as `{}`).
    #[default]
    None,
    Deployment(DeploymentDetail),
    Statefulset(StatefulsetDetail),
    Asset(AssetDetail),
    Registry(RegistryDetail),
    Ingress(IngressDetail),
    Job(JobDetail),
    Cronjob(CronjobDetail),
}

impl Detail {
    #[cfg(test)]
    pub(crate) fn is_none(&self) -> bool {
        matches!(self, Detail::None)
    }

    /// The stored text: `{}` for `None`.
    pub(crate) fn to_json(&self) -> String {
        match self {
            Detail::None => "{}".to_owned(),
            other => serde_json::to_string(other).unwrap_or_else(|_| "{}".to_owned()),
        }
    }

    /// Reads the stored text of a `kind`'s row; see the module's invariants.
    pub(crate) fn from_json(kind: Kind, text: &str) -> Detail {
        fn read<T: serde::de::DeserializeOwned>(text: &str, wrap: fn(T) -> Detail) -> Detail {
            serde_json::from_str(text).map_or(Detail::None, wrap)
        }
        let empty = serde_json::from_str::<serde_json::Value>(text).map_or(true, |value| {
            value.is_null() || value.as_object().is_some_and(serde_json::Map::is_empty)
        });
        if empty {
            return Detail::None;
        }
        match kind {
            Kind::Deployment => read(text, Detail::Deployment),
            Kind::Statefulset => read(text, Detail::Statefulset),
            Kind::Asset => read(text, Detail::Asset),
            Kind::Registry => read(text, Detail::Registry),
            Kind::Ingress => read(text, Detail::Ingress),
            Kind::Job => read(text, Detail::Job),
            Kind::Cronjob => read(text, Detail::Cronjob),
        }
    }

    /// The stored JSON as a value (`Null` for `None`), for tests and diagnostics; the
    /// `status --json` document is shaped by `http::detail`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// A deployment's replicas and their readiness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentDetail {
    /// Set while `autoscale {}` chose the count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaled_replicas: Option<usize>,
    pub ready_replicas: usize,
    pub replicas: Vec<ReplicaDetail>,
}

/// One replica container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDetail {
    /// Of the desired spec hash and environment.
    pub current: bool,
    pub name: String,
    pub ready: bool,
    /// Why it is not ready (empty when it is).
    pub reason: String,
    /// `running`, `created`, `exited`, … (lowercase).
    pub state: String,
}

/// A statefulset's pods and volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatefulsetDetail {
    pub(crate) pods: Vec<PodDetail>,
    pub(crate) ready_replicas: usize,
    pub(crate) volumes: Vec<VolumeDetail>,
}

/// One pod of a statefulset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodDetail {
    pub(crate) current: bool,
    pub(crate) name: String,
    pub(crate) ordinal: Option<usize>,
    pub(crate) ready: bool,
    pub(crate) reason: String,
    pub(crate) state: String,
    pub(crate) volumes: Vec<String>,
}

/// One volume of a statefulset; `kept` past the replica count (a scale-down keeps data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDetail {
    pub(crate) claim: Option<String>,
    pub(crate) kept: bool,
    pub(crate) name: String,
    pub(crate) ordinal: Option<usize>,
}

/// An asset's files on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssetDetail {
    pub(crate) files: BTreeMap<String, AssetFileDetail>,
    pub(crate) path: PathBuf,
    /// Keys whose file differed on the host and was rewritten by this pass.
    pub(crate) repaired: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssetFileDetail {
    pub(crate) digest: String,
    pub(crate) size: u64,
    pub(crate) source: String,
}

/// A registry, never its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryDetail {
    /// `token` or `helper`.
    pub(crate) credentials: String,
    pub(crate) helper: String,
    pub(crate) url: String,
    pub(crate) username: String,
}

/// What an ingress routes, to where, and where the proxy listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngressDetail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) health_check: Option<HealthCheckDetail>,
    pub(crate) host: String,
    /// The proxy serves this ingress's routes as they are now.
    pub(crate) live: bool,
    pub(crate) policy: String,
    pub(crate) port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) proxy: Option<ProxyDetail>,
    pub(crate) routes: Vec<RouteDetail>,
    pub(crate) service: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tls: Option<TlsDetail>,
    pub(crate) upstreams: Vec<String>,
    pub(crate) url: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheckDetail {
    pub(crate) interval: String,
    pub(crate) path: String,
    pub(crate) port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyDetail {
    pub(crate) container: String,
    pub(crate) http: Option<String>,
    pub(crate) https: Option<String>,
}

/// One route; `served_by` names the ingress that routes this host + path first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteDetail {
    pub(crate) path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) served_by: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) strip: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsDetail {
    pub(crate) ask: String,
    pub(crate) email: String,
    pub(crate) on_demand: bool,
    pub(crate) provider: String,
}

/// A job's image, timeout and run history (newest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDetail {
    pub(crate) history: Vec<RunDetail>,
    pub(crate) image: String,
    pub(crate) last_run: Option<RunDetail>,
    pub(crate) timeout: String,
}

/// One run of a job or cronjob; times are RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunDetail {
    pub(crate) container: String,
    pub(crate) duration_seconds: Option<i64>,
    pub(crate) ended_at: Option<String>,
    pub(crate) error: String,
    pub(crate) exit_code: Option<i64>,
    pub(crate) logs_tail: String,
    pub(crate) run_id: String,
    pub(crate) spec_hash: String,
    pub(crate) started_at: String,
    /// `running`, `succeeded` or `failed`.
    pub(crate) status: String,
}

/// A cronjob's schedule, position, run history and skipped ticks (newest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronjobDetail {
    pub(crate) concurrency_policy: String,
    pub(crate) history: Vec<RunDetail>,
    pub(crate) image: String,
    pub(crate) last_run: Option<RunDetail>,
    pub(crate) last_scheduled: Option<String>,
    pub(crate) next_run: Option<String>,
    pub(crate) next_run_local: Option<String>,
    pub(crate) schedule: String,
    pub(crate) skipped: Vec<SkipDetail>,
    pub(crate) suspend: bool,
    pub(crate) timezone: String,
}

/// A tick that did not run: `missed` (`n_times` from `first` to `last`), `forbid` or
/// `error` (at `scheduled_at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipDetail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) first: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last: Option<String>,
    pub(crate) message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) n_times: Option<u64>,
    pub(crate) reason: String,
    pub(crate) recorded_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) scheduled_at: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows written by the `json!` objects these types replaced read back, and print the
    /// same bytes again; an empty or unreadable detail is `None`.
    #[test]
    fn old_rows_read_and_print_the_same_json() {
        let cases = [
            (
                Kind::Deployment,
                r#"{"autoscaled_replicas":3,"ready_replicas":1,"replicas":[{"current":true,"name":"s-web.ab12","ready":true,"reason":"","state":"running"}]}"#,
            ),
            (Kind::Deployment, r#"{"ready_replicas":0,"replicas":[]}"#),
            (
                Kind::Statefulset,
                r#"{"pods":[{"current":true,"name":"s-db-0","ordinal":0,"ready":false,"reason":"starting","state":"running","volumes":["voodu-data-s-db-data-0"]}],"ready_replicas":0,"volumes":[{"claim":"data","kept":false,"name":"voodu-data-s-db-data-0","ordinal":0}]}"#,
            ),
            (
                Kind::Asset,
                r#"{"files":{"caddyfile":{"digest":"ab","size":12,"source":"inline"}},"path":"/data/assets/s/site","repaired":["caddyfile"]}"#,
            ),
            (
                Kind::Registry,
                r#"{"credentials":"token","helper":"","url":"ghcr.io","username":"me"}"#,
            ),
            (
                Kind::Ingress,
                r#"{"health_check":{"interval":"10s","path":"/healthz","port":null},"host":"shop.test","live":false,"policy":"round_robin","port":8080,"routes":[{"path":"/api","served_by":"ingress/s/other","strip":true}],"service":"web","upstreams":[],"url":"http://shop.test","warnings":["w"]}"#,
            ),
            (
                Kind::Job,
                r#"{"history":[],"image":"busybox","last_run":null,"timeout":"90s"}"#,
            ),
            (
                Kind::Cronjob,
                r#"{"concurrency_policy":"Allow","history":[{"container":"s-tick.0001","duration_seconds":2,"ended_at":"1970-01-01T00:00:02Z","error":"","exit_code":0,"logs_tail":"ok\n","run_id":"0001","spec_hash":"h","started_at":"1970-01-01T00:00:00Z","status":"succeeded"}],"image":"busybox","last_run":null,"last_scheduled":null,"next_run":"1970-01-01T00:01:00Z","next_run_local":null,"schedule":"* * * * *","skipped":[{"first":"1970-01-01T00:00:00Z","last":"1970-01-01T00:00:00Z","message":"m","n_times":1,"reason":"missed","recorded_at":"1970-01-01T00:00:00Z"},{"message":"m","reason":"forbid","recorded_at":"1970-01-01T00:00:00Z","scheduled_at":"1970-01-01T00:00:00Z"}],"suspend":false,"timezone":"UTC"}"#,
            ),
        ];
        for (kind, text) in cases {
            let detail = Detail::from_json(kind, text);
            assert!(!detail.is_none(), "{kind}: {text}");
            assert_eq!(detail.to_json(), text, "{kind}");
        }
        for (kind, text) in [
            (Kind::Job, "{}"),
            (Kind::Job, "null"),
            (Kind::Registry, r#"{"url":1}"#),
        ] {
            assert_eq!(
                Detail::from_json(kind, text),
                Detail::None,
                "{kind}: {text}"
            );
        }
        assert_eq!(Detail::None.to_json(), "{}");
    }
}
