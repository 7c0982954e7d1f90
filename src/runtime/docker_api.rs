//! The engine requests whose answers `DockerRuntime` decodes itself, into only the fields it
//! reads: inspecting and listing containers, images, networks, volumes and execs, a
//! container's CPU sample, and the swarm's state, nodes, services, tasks and configs.
//!
//! bollard decodes every answer into the API's whole model (each field of a host config, of a
//! service's task template, of the engine's `info`), and those decoders were 0.66 MB of the
//! binary's code for about sixty fields read (issue 54). The structs here name those fields
//! and serde skips the rest of an answer. Requests that change something, and the streams
//! (events, logs, pulls, exec, wait), stay bollard's.
//!
//! Invariants: a request goes over the socket bollard connected to (`DOCKER_HOST` when it is
//! `unix://…`, else `/var/run/docker.sock`), to the API version it negotiated, with its
//! timeout (120 s); an answer is read up to [`MAX_ANSWER`] bytes; an engine error is
//! classified as bollard's are (`docker::classify_answer`); a name put in a path is
//! percent-encoded and never a `.` or `..` segment (a URL would resolve it to another path).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};

use super::docker::classify_answer;
use super::{Error, Result};

/// Most bytes of one answer read (a list of 1,000 containers is about 2 MB).
pub(super) const MAX_ANSWER: usize = 64 << 20;

/// How long one request may take, as bollard's default.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The engine's API over its unix socket.
#[derive(Clone)]
pub(super) struct Api {
    client: reqwest::Client,
    /// `http://docker/v1.NN`: the socket is the connection, the host name is not used.
    base: String,
}

/// The socket `Docker::connect_with_local_defaults` connects to.
fn socket_path() -> PathBuf {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

impl Api {
    /// A client of the local engine speaking `version` (what bollard negotiated).
    pub(super) fn new(version: &bollard::ClientVersion) -> Result<Api> {
        let unavailable = |message: String| Error::Unavailable { message };
        // Never used (the URL is http), but reqwest is built without a default TLS provider.
        let tls =
            crate::model::tls::without_roots().map_err(|error| unavailable(error.to_string()))?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .unix_socket(socket_path())
            .timeout(TIMEOUT)
            .build()
            .map_err(|error| unavailable(format!("cannot make the engine's client: {error}")))?;
        Ok(Api {
            client,
            base: format!(
                "http://docker/v{}.{}",
                version.major_version, version.minor_version
            ),
        })
    }

    /// `GET path?query`, its answer decoded as `T`.
    pub(super) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T> {
        let answer = self
            .answer(self.client.get(self.url(path, query)), path)
            .await?;
        decode(&answer, path)
    }

    /// `POST path` with a JSON `body`, its answer decoded as `T`.
    pub(super) async fn post<T: DeserializeOwned>(&self, path: &str, body: Vec<u8>) -> Result<T> {
        let request = self
            .client
            .post(self.url(path, &[]))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        let answer = self.answer(request, path).await?;
        decode(&answer, path)
    }

    fn url(&self, path: &str, query: &[(&str, &str)]) -> String {
        let mut url = format!("{}{path}", self.base);
        if !query.is_empty() {
            url.push('?');
            url.push_str(
                &form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(query)
                    .finish(),
            );
        }
        url
    }

    /// The body of a successful answer, or the engine's error classified.
    async fn answer(&self, request: reqwest::RequestBuilder, path: &str) -> Result<Vec<u8>> {
        let failed = |error: reqwest::Error| Error::Unavailable {
            message: format!("{path}: {error}"),
        };
        let mut response = request.send().await.map_err(failed)?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(Error::Unavailable {
                    message: format!("{path}: the engine's answer is over {MAX_ANSWER} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        if status.is_success() {
            Ok(body)
        } else {
            Err(classify_answer(status.as_u16(), error_message(&body)))
        }
    }
}

/// The message of an engine's error answer: its JSON `message`, else the text (as bollard).
fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Answer {
        message: String,
    }
    match serde_json::from_slice::<Answer>(body) {
        Ok(answer) => answer.message,
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    }
}

fn decode<T: DeserializeOwned>(answer: &[u8], path: &str) -> Result<T> {
    serde_json::from_slice(answer).map_err(|error| Error::Unavailable {
        message: format!("{path}: cannot read the engine's answer: {error}"),
    })
}

/// `name` as one part of a request's path: percent-encoded but for the characters of ids,
/// names and image references (`/` stays: an image is routed with its slashes, as the CLI
/// sends it). A `.` or `..` segment is refused: the URL would resolve it to another path.
pub(super) fn segment(name: &str) -> Result<String> {
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(Error::Invalid {
            message: format!("{name:?} is not a name the engine can be asked about"),
        });
    }
    let mut encoded = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:@/".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(encoded)
}

/// The `filters` query parameter: a JSON object of names to lists of values.
pub(super) fn filters(filters: &BTreeMap<&str, Vec<String>>) -> String {
    serde_json::to_string(filters).unwrap_or_else(|_| "{}".to_owned())
}

/// Labels as the engine writes them (`null` when there are none).
type Labels = Option<BTreeMap<String, String>>;

/// `GET /containers/json`, one container.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ContainerSummary {
    pub(super) id: Option<String>,
    pub(super) names: Option<Vec<String>>,
    pub(super) image: Option<String>,
    pub(super) labels: Labels,
    pub(super) state: Option<String>,
}

/// `GET /containers/{id}/json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ContainerInspect {
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
    pub(super) restart_count: Option<i64>,
    pub(super) state: Option<ContainerInspectState>,
    pub(super) network_settings: Option<NetworkSettings>,
    pub(super) config: Option<ContainerConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ContainerInspectState {
    pub(super) running: Option<bool>,
    pub(super) exit_code: Option<i64>,
    #[serde(rename = "OOMKilled")]
    pub(super) oom_killed: Option<bool>,
    pub(super) started_at: Option<String>,
    pub(super) finished_at: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(super) struct NetworkSettings {
    /// `"80/tcp"` → the host bindings (`null` for a port exposed but not published).
    pub(super) ports: Option<BTreeMap<String, Option<Vec<PortBinding>>>>,
    pub(super) networks: Option<BTreeMap<String, Endpoint>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct PortBinding {
    pub(super) host_ip: Option<String>,
    pub(super) host_port: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Endpoint {
    #[serde(rename = "IPAddress")]
    pub(super) ip_address: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ContainerConfig {
    pub(super) labels: Labels,
}

/// `GET /exec/{id}/json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ExecInspect {
    pub(super) exit_code: Option<i64>,
}

/// `GET /volumes/{name}`, `POST /volumes/create`, one of `GET /volumes`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Volume {
    pub(super) name: String,
    pub(super) labels: Labels,
    pub(super) mountpoint: String,
}

/// `GET /volumes`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct VolumeList {
    pub(super) volumes: Option<Vec<Volume>>,
}

/// One of `GET /networks`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct NetworkSummary {
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
}

/// `GET /networks/{id}`: the containers attached, by id.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct NetworkInspect {
    pub(super) containers: Option<BTreeMap<String, IgnoredAny>>,
}

/// `GET /images/{name}/json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ImageInspect {
    pub(super) id: Option<String>,
    pub(super) repo_digests: Option<Vec<String>>,
}

/// `GET /containers/{id}/stats?stream=false`: the CPU counters of this sample and the last.
#[derive(Deserialize)]
pub(super) struct Stats {
    pub(super) cpu_stats: Option<CpuStats>,
    pub(super) precpu_stats: Option<CpuStats>,
}

#[derive(Deserialize)]
pub(super) struct CpuStats {
    pub(super) cpu_usage: Option<CpuUsage>,
    pub(super) system_cpu_usage: Option<u64>,
    pub(super) online_cpus: Option<u32>,
}

#[derive(Deserialize)]
pub(super) struct CpuUsage {
    pub(super) total_usage: Option<u64>,
}

/// `GET /info`: its swarm part.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Info {
    pub(super) swarm: Option<SwarmInfo>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct SwarmInfo {
    #[serde(rename = "NodeID")]
    pub(super) node_id: Option<String>,
    pub(super) local_node_state: Option<String>,
    pub(super) control_available: Option<bool>,
}

/// One of `GET /nodes`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Node {
    #[serde(rename = "ID")]
    pub(super) id: Option<String>,
    pub(super) description: Option<NodeDescription>,
    pub(super) status: Option<NodeStatus>,
    pub(super) spec: Option<NodeSpec>,
    /// Present on managers only.
    pub(super) manager_status: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct NodeDescription {
    pub(super) hostname: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct NodeStatus {
    pub(super) state: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct NodeSpec {
    pub(super) availability: Option<String>,
}

/// One of `GET /services`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Service {
    #[serde(rename = "ID")]
    pub(super) id: Option<String>,
    pub(super) version: Option<ObjectVersion>,
    pub(super) spec: Option<ServiceSpec>,
    pub(super) update_status: Option<ServiceUpdateStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ObjectVersion {
    pub(super) index: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ServiceSpec {
    pub(super) name: Option<String>,
    pub(super) labels: Labels,
    pub(super) task_template: Option<TaskTemplate>,
    pub(super) mode: Option<ServiceMode>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TaskTemplate {
    pub(super) container_spec: Option<TaskContainerSpec>,
    pub(super) placement: Option<Placement>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TaskContainerSpec {
    pub(super) image: Option<String>,
    pub(super) labels: Labels,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Placement {
    pub(super) constraints: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ServiceMode {
    pub(super) replicated: Option<Replicated>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Replicated {
    pub(super) replicas: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ServiceUpdateStatus {
    pub(super) state: Option<String>,
    pub(super) message: Option<String>,
    pub(super) started_at: Option<String>,
}

/// One of `GET /tasks`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Task {
    #[serde(rename = "ID")]
    pub(super) id: Option<String>,
    #[serde(rename = "ServiceID")]
    pub(super) service_id: Option<String>,
    pub(super) slot: Option<i64>,
    #[serde(rename = "NodeID")]
    pub(super) node_id: Option<String>,
    pub(super) desired_state: Option<String>,
    pub(super) status: Option<TaskStatus>,
    pub(super) spec: Option<TaskSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TaskSpec {
    pub(super) container_spec: Option<TaskContainerSpec>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TaskStatus {
    pub(super) timestamp: Option<String>,
    pub(super) state: Option<String>,
    pub(super) message: Option<String>,
    pub(super) err: Option<String>,
    pub(super) container_status: Option<TaskContainerStatus>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TaskContainerStatus {
    #[serde(rename = "ContainerID")]
    pub(super) container_id: Option<String>,
    pub(super) exit_code: Option<i64>,
}

/// One of `GET /configs`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Config {
    #[serde(rename = "ID")]
    pub(super) id: Option<String>,
    pub(super) spec: Option<ConfigSpec>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ConfigSpec {
    pub(super) name: Option<String>,
    pub(super) labels: Labels,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_in_a_path_is_encoded_and_never_a_dot_segment() -> Result<()> {
        assert_eq!(
            segment("registry:5000/team/app:1.2@sha256:ab")?,
            "registry:5000/team/app:1.2@sha256:ab"
        );
        assert_eq!(segment("a b?c#d%")?, "a%20b%3Fc%23d%25");
        for refused in ["..", "../containers", "a/./b", "a//b", "", "x/.."] {
            assert!(
                matches!(segment(refused), Err(Error::Invalid { .. })),
                "{refused:?} is refused"
            );
        }
        Ok(())
    }

    #[test]
    fn an_error_answer_keeps_the_engines_message() {
        assert_eq!(
            error_message(br#"{"message":"No such container: abc"}"#),
            "No such container: abc"
        );
        assert_eq!(error_message(b"page not found"), "page not found");
    }

    #[test]
    fn answers_decode_the_fields_read_and_skip_the_rest() -> Result<()> {
        // Trimmed from Docker 20.10's answers: fields around the ones read are skipped.
        let inspect: ContainerInspect = decode(
            br#"{"Id":"c1","Name":"/web","RestartCount":2,
                 "State":{"Status":"exited","Running":false,"ExitCode":137,"OOMKilled":true,
                          "StartedAt":"2026-01-01T00:00:00Z","FinishedAt":"2026-01-01T00:01:00Z",
                          "Health":{"Status":"unhealthy","Log":[]}},
                 "HostConfig":{"Binds":null,"RestartPolicy":{"Name":"always"}},
                 "NetworkSettings":{"Ports":{"80/tcp":[{"HostIp":"0.0.0.0","HostPort":"8080"}],
                                             "443/tcp":null},
                                    "Networks":{"voodu0":{"IPAddress":"172.18.0.2","Aliases":["web"]}}},
                 "Config":{"Labels":{"voodu.kind":"deployment"},"Env":["A=1"]}}"#,
            "inspect",
        )?;
        assert_eq!(inspect.id.as_deref(), Some("c1"));
        assert_eq!(inspect.restart_count, Some(2));
        let state = inspect.state.unwrap_or_default();
        assert_eq!(
            (state.running, state.exit_code, state.oom_killed),
            (Some(false), Some(137), Some(true))
        );
        let settings = inspect.network_settings.unwrap_or_default();
        let ports = settings.ports.unwrap_or_default();
        assert_eq!(ports.len(), 2);
        assert!(ports["443/tcp"].is_none());
        let bound = &ports["80/tcp"].as_deref().unwrap_or_default()[0];
        assert_eq!(bound.host_port.as_deref(), Some("8080"));
        assert_eq!(
            settings.networks.unwrap_or_default()["voodu0"]
                .ip_address
                .as_deref(),
            Some("172.18.0.2")
        );
        assert_eq!(
            inspect
                .config
                .and_then(|config| config.labels)
                .unwrap_or_default()["voodu.kind"],
            "deployment"
        );

        let nodes: Vec<Node> = decode(
            br#"[{"ID":"n1","Description":{"Hostname":"h1","Engine":{"EngineVersion":"20.10"}},
                  "Status":{"State":"ready","Addr":"10.0.0.1"},"Spec":{"Availability":"active","Role":"manager"},
                  "ManagerStatus":{"Leader":true,"Reachability":"reachable"}},
                 {"ID":"n2","Status":{"State":"down"},"Spec":{"Availability":"drain"}}]"#,
            "nodes",
        )?;
        assert!(nodes[0].manager_status.is_some());
        assert!(nodes[1].manager_status.is_none());
        assert_eq!(
            nodes[1]
                .status
                .as_ref()
                .and_then(|status| status.state.as_deref()),
            Some("down")
        );

        let summary: Vec<ContainerSummary> = decode(
            br#"[{"Id":"c1","Names":["/web"],"Image":"app:1","Labels":null,"State":"running",
                  "Ports":[{"PrivatePort":80,"Type":"tcp"}],"Mounts":[]}]"#,
            "list",
        )?;
        assert_eq!(summary[0].state.as_deref(), Some("running"));
        assert!(summary[0].labels.is_none());

        let refused = decode::<Info>(b"{\"Swarm\":", "info");
        assert!(matches!(refused, Err(Error::Unavailable { .. })));
        Ok(())
    }
}
