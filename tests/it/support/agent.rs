//! `TestAgent`: the agent in process (`agent::run_with_runtime`) over a `TempRepo`, with a
//! temp data dir, the fake runtime and its HTTP side on a listener it bound on `127.0.0.1:0`
//! (mini-redis `start_server`). Its own store handle reads what the agent wrote.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use voodu_agent::agent::{AgentConfig, HttpConfig};
use voodu_agent::git::SourceOptions;
use voodu_agent::http::{HttpOptions, WebhookSecret};
use voodu_agent::reconcile::ReconcileOptions;
use voodu_agent::runtime::FakeRuntime;
use voodu_agent::store::Store;

use super::{TempRepo, TestResult};

/// How to start a `TestAgent`.
pub struct TestAgentOptions {
    pub interval: Duration,
    pub secret: Option<String>,
    pub watch_local: bool,
    /// `--notify`: where events go.
    pub notify: Option<voodu_agent::notify::NotifyConfig>,
    /// `--window`: the deploy windows.
    pub windows: Vec<voodu_agent::manifest::window::WindowRule>,
    /// `--preview-*`: branch previews of the repository.
    pub previews: Option<voodu_agent::model::previews::PreviewRules>,
    /// `--policy`: the host policy (default: default-deny).
    pub policy: Option<voodu_agent::model::policy::Policy>,
}

impl Default for TestAgentOptions {
    fn default() -> Self {
        TestAgentOptions {
            // Long enough that only the start-up poll happens: tests trigger syncs themselves.
            interval: Duration::from_secs(3600),
            secret: None,
            watch_local: false,
            notify: None,
            windows: Vec::new(),
            previews: None,
            policy: None,
        }
    }
}

/// The agent's configuration over `repo` and `data_dir` as tests run it on the fake runtime:
/// polls every 100 ms, replicas ready at once, default HTTP options (serving only when given a
/// listener); tests change what they need.
pub fn fake_agent_config(repo: &TempRepo, data_dir: &std::path::Path) -> AgentConfig {
    AgentConfig {
        source: SourceOptions {
            url: repo.url(),
            branch: "main".into(),
            paths: Vec::new(),
            token_file: None,
            ..Default::default()
        },
        hosts: voodu_agent::model::HostSelection::every_host(),
        data_dir: data_dir.to_owned(),
        interval: Duration::from_millis(100),
        sync: voodu_agent::sync::SyncOptions::new(data_dir.to_owned()),
        reconcile: ReconcileOptions {
            ready_settle: Duration::ZERO,
            ..ReconcileOptions::default()
        },
        http: HttpConfig::default(),
        watch_local: false,
        adopt: false,
        service: Default::default(),
        notify: None,
        image_signing_key: None,
        sources: Vec::new(),
        previews: None,
    }
}

pub struct TestAgent {
    pub repo: TempRepo,
    pub data: tempfile::TempDir,
    pub fake: Arc<FakeRuntime>,
    pub store: Store,
    pub address: SocketAddr,
    pub secret: Option<WebhookSecret>,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestAgent {
    /// Starts the agent on a listener bound here and waits until its HTTP side answers.
    pub async fn start(repo: TempRepo, options: TestAgentOptions) -> TestResult<TestAgent> {
        let data = tempfile::tempdir()?;
        let secret_file = match &options.secret {
            Some(secret) => {
                let path = data.path().join("webhook.secret");
                std::fs::write(&path, format!("{secret}\n"))?;
                Some(path)
            }
            None => None,
        };
        let secret = options.secret.as_deref().map(WebhookSecret::new);
        let mut config = AgentConfig {
            interval: options.interval,
            http: HttpConfig {
                secret_file,
                options: HttpOptions {
                    secret: secret.clone(),
                    ..HttpOptions::default()
                },
            },
            watch_local: options.watch_local,
            notify: options.notify.clone(),
            previews: options.previews.clone(),
            ..fake_agent_config(&repo, &data.path().join("data"))
        };
        config.sync.windows = options.windows.clone();
        if let Some(policy) = &options.policy {
            config.sync.policy = voodu_agent::model::policy::Policy {
                data_dir: config.sync.policy.data_dir.clone(),
                ..policy.clone()
            };
        }
        let state_db: PathBuf = config.state_db();
        let fake = Arc::new(FakeRuntime::new());
        let shutdown = CancellationToken::new();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let mut task = tokio::spawn(voodu_agent::agent::run_with_runtime(
            config,
            fake.clone(),
            Some(listener),
            shutdown.clone().cancelled_owned(),
        ));
        // The kernel queues the request until the agent serves, which it does once state.db
        // is open; an agent that stops during start-up drops the listener.
        let client = super::http::client()?;
        let health_url = format!("http://{address}/healthz");
        let health = super::http::get(&client, &health_url);
        let up = tokio::time::timeout(Duration::from_secs(20), async {
            let started: TestResult = tokio::select! {
                biased;
                finished = &mut task => {
                    finished??;
                    Err("the agent stopped during start-up".into())
                }
                answer = health => match answer {
                    Ok(_) => Ok(()),
                    // A stopping agent drops the connection: its own error says why.
                    Err(error) => {
                        (&mut task).await??;
                        Err(format!("the agent stopped during start-up: {error}").into())
                    }
                },
            };
            started
        });
        match up.await {
            Ok(result) => result?,
            Err(_) => return Err("the agent's HTTP side never answered".into()),
        }
        let store = Store::open(&state_db)?;
        Ok(TestAgent {
            repo,
            data,
            fake,
            store,
            address,
            secret,
            shutdown,
            task: Some(task),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data.path().join("data")
    }

    /// Waits (liveness bound) until `check` holds on the agent's store.
    pub async fn until<T>(
        &self,
        what: &str,
        check: impl FnMut(&Store) -> TestResult<Option<T>>,
    ) -> TestResult<T> {
        self.until_within(Duration::from_secs(30), what, check)
            .await
    }

    /// `until` with another liveness bound (a step several syncs long on a loaded machine).
    pub async fn until_within<T>(
        &self,
        limit: Duration,
        what: &str,
        mut check: impl FnMut(&Store) -> TestResult<Option<T>>,
    ) -> TestResult<T> {
        let step = Duration::from_millis(10);
        super::until(limit, step, what, || check(&self.store)).await
    }

    /// Waits until `sha` is the last applied commit.
    pub async fn applied(&self, sha: &str) -> TestResult {
        self.until(&format!("commit {sha} applied"), |store| {
            Ok(store
                .commit_summary()?
                .last_applied
                .filter(|record| record.sha.as_str() == sha)
                .map(|_| ()))
        })
        .await
    }

    /// Stops the agent and waits for every task to finish.
    pub async fn stop(mut self) -> TestResult {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await??;
        }
        Ok(())
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Waits until no one holds `data_dir`'s lock, for an agent restarted in this process right
/// after the previous one returned: the previous agent closed the lock file, but a child
/// another test thread was spawning at that moment holds a copy of the descriptor (and so the
/// `flock`) until its exec, and the new agent would refuse the data dir as in use.
pub fn wait_data_dir_unlocked(data_dir: &std::path::Path) -> TestResult {
    let path = data_dir.join("lock");
    if !path.exists() {
        return Ok(());
    }
    let file = std::fs::File::options().read(true).open(&path)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file.unlock()?),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => return Err(format!("{}: still locked: {error}", path.display()).into()),
        }
    }
}
