//! A repository on this host as a fetch's remote: `git upload-pack` started by the agent with
//! partial fetches allowed, behind gix's transport traits, so `fetch.rs` negotiates with it
//! as with any server.
//!
//! Invariants: `git` inherits no repository, object directory or configuration from the
//! agent's environment; the process is gone (waited for) when the transport is dropped.

use gix::protocol::transport::client::blocking_io::Transport;

/// A repository on this host, served by `git upload-pack` as gix's file transport serves it,
/// but allowed to filter (`-c uploadpack.allowFilter=true`): a local repository's own
/// config rarely says so, and its large blobs cost the mirror as much as a remote's.
pub(super) struct UploadPack {
    path: std::path::PathBuf,
    child: Option<std::process::Child>,
    connection: Option<Connection>,
}

type Connection = gix::protocol::transport::client::git::blocking_io::Connection<
    std::process::ChildStdout,
    std::process::ChildStdin,
>;

/// What a `git` started here must not inherit from the agent's environment (a repository,
/// object directory or configuration other than the one named).
const GIT_ENVIRONMENT: &[&str] = &[
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_DIR",
    "GIT_INDEX_FILE",
    "GIT_NAMESPACE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_WORK_TREE",
];

impl UploadPack {
    pub(super) fn new(path: std::path::PathBuf) -> UploadPack {
        UploadPack {
            path,
            child: None,
            connection: None,
        }
    }
}

impl Drop for UploadPack {
    /// Says the interaction is over, closes `git`'s input and reaps it (killed first, in
    /// case it has not left yet: nothing more is read from it).
    fn drop(&mut self) {
        if self.connection.is_some() {
            gix::protocol::indicate_end_of_interaction(&mut *self, false).ok();
        }
        self.connection = None;
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl gix::protocol::transport::client::TransportWithoutIO for UploadPack {
    fn to_url(&self) -> std::borrow::Cow<'_, gix::bstr::BStr> {
        std::borrow::Cow::Owned(format!("file://{}", self.path.display()).into())
    }

    fn connection_persists_across_multiple_requests(&self) -> bool {
        true
    }

    fn configure(&mut self, _config: &dyn std::any::Any) -> gix::Result<()> {
        Ok(())
    }
}

impl Transport for UploadPack {
    fn handshake<'a>(
        &mut self,
        service: gix::protocol::transport::Service,
        extra_parameters: &'a [(&'a str, Option<&'a str>)],
    ) -> Result<
        gix::protocol::transport::client::blocking_io::SetServiceResponse<'_>,
        gix::protocol::transport::client::Error,
    > {
        use gix::protocol::transport::client::Error as TransportError;
        let mut command = std::process::Command::new("git");
        command
            .args([
                "-c",
                "uploadpack.allowFilter=true",
                service.as_git_subcommand(),
            ])
            .arg(&self.path)
            .env("GIT_PROTOCOL", "version=2")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        for name in GIT_ENVIRONMENT {
            command.env_remove(name);
        }
        let mut child = command
            .spawn()
            .map_err(|source| TransportError::InvokeProgram {
                source,
                command: "git upload-pack".into(),
            })?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(TransportError::Io(std::io::Error::other(
                "git upload-pack started without its pipes",
            )));
        };
        self.child = Some(child);
        let connection = self.connection.insert(Connection::new(
            stdout,
            stdin,
            gix::protocol::transport::Protocol::V2,
            self.path.to_string_lossy().into_owned(),
            None::<(String, Option<u16>)>,
            gix::protocol::transport::client::git::ConnectMode::Process,
            false,
        ));
        connection.handshake(service, extra_parameters)
    }

    fn request(
        &mut self,
        write_mode: gix::protocol::transport::client::WriteMode,
        on_into_read: gix::protocol::transport::client::MessageKind,
        trace: bool,
    ) -> Result<
        gix::protocol::transport::client::blocking_io::RequestWriter<'_>,
        gix::protocol::transport::client::Error,
    > {
        self.connection
            .as_mut()
            .ok_or(gix::protocol::transport::client::Error::MissingHandshake)?
            .request(write_mode, on_into_read, trace)
    }
}
