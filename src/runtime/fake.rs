//! `FakeRuntime`: containers in memory, with a call log and fault injection, for fast
//! reconcile tests under paused time.
//!
//! Invariant: it behaves as the Docker engine does for every verb the contract suite checks
//! (duplicate names conflict, unknown images and networks fail, removing a missing container
//! succeeds, `list` returns stopped containers); anything a test assumes beyond that must be
//! added to the contract suite first.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;

use super::{Container, ContainerSpec, ContainerState, Error, Result, Runtime};

/// An in-memory engine.
#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    containers: BTreeMap<String, (Container, ContainerSpec)>,
    next_id: u64,
    networks: BTreeSet<String>,
    /// `None`: every image exists.
    images: Option<BTreeSet<String>>,
    calls: Vec<String>,
    faults: VecDeque<(String, Fault)>,
}

/// What an injected fault does when its verb is called.
#[derive(Debug, Clone)]
pub enum Fault {
    Fail(Error),
    Panic(String),
}

impl FakeRuntime {
    pub fn new() -> FakeRuntime {
        FakeRuntime::default()
    }

    /// A fake that knows only these images: creating from any other fails as on an engine
    /// without a registry.
    pub fn with_images(images: &[&str]) -> FakeRuntime {
        let fake = FakeRuntime::default();
        fake.lock().images = Some(images.iter().map(|image| (*image).to_owned()).collect());
        fake
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every verb called so far, as `verb name-or-id`.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// The next call of `verb` (`create`, `start`, `remove`, `list`, `ensure_network`) fails
    /// or panics instead of acting. Faults queue up in order.
    pub fn inject(&self, verb: &str, fault: Fault) {
        self.lock().faults.push_back((verb.to_owned(), fault));
    }

    /// Simulates a container exiting on its own (or `docker stop` by hand).
    pub fn exit(&self, id: &str) {
        if let Some((container, _)) = self.lock().containers.get_mut(id) {
            container.state = ContainerState::Exited;
        }
    }

    /// The spec a container was created from.
    pub fn spec_of(&self, id: &str) -> Option<ContainerSpec> {
        self.lock().containers.get(id).map(|(_, spec)| spec.clone())
    }

    fn enter(&self, verb: &str, subject: &str) -> Result<()> {
        let fault = {
            let mut state = self.lock();
            state.calls.push(format!("{verb} {subject}"));
            let position = state.faults.iter().position(|(faulty, _)| faulty == verb);
            position
                .and_then(|index| state.faults.remove(index))
                .map(|(_, fault)| fault)
        };
        match fault {
            None => Ok(()),
            Some(Fault::Fail(error)) => Err(error),
            Some(Fault::Panic(message)) => panic!("{message}"),
        }
    }
}

impl Runtime for FakeRuntime {
    async fn list(&self, filter: &[(&str, &str)]) -> Result<Vec<Container>> {
        self.enter("list", "")?;
        Ok(self
            .lock()
            .containers
            .values()
            .filter(|(container, _)| {
                filter
                    .iter()
                    .all(|(key, value)| container.label(key) == Some(value))
            })
            .map(|(container, _)| container.clone())
            .collect())
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String> {
        self.enter("create", &spec.name)?;
        let mut state = self.lock();
        if let Some(images) = &state.images
            && !images.contains(&spec.image)
        {
            return Err(Error::ImageMissing {
                image: spec.image.clone(),
                message: format!("No such image: {}", spec.image),
            });
        }
        if let Some(missing) = spec
            .networks
            .iter()
            .find(|network| !state.networks.contains(*network))
        {
            return Err(Error::NotFound {
                what: format!("network {missing}"),
            });
        }
        if state
            .containers
            .values()
            .any(|(container, _)| container.name == spec.name)
        {
            return Err(Error::Conflict {
                name: spec.name.clone(),
                message: format!("the container name \"/{}\" is already in use", spec.name),
            });
        }
        state.next_id += 1;
        let id = format!("fake{:060}", state.next_id);
        let container = Container {
            id: id.clone(),
            name: spec.name.clone(),
            image: spec.image.clone(),
            labels: spec.labels.clone(),
            state: ContainerState::Created,
        };
        state
            .containers
            .insert(id.clone(), (container, spec.clone()));
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.enter("start", id)?;
        match self.lock().containers.get_mut(id) {
            Some((container, _)) => {
                container.state = ContainerState::Running;
                Ok(())
            }
            None => Err(Error::NotFound {
                what: format!("container {id}"),
            }),
        }
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.enter("remove", id)?;
        self.lock().containers.remove(id);
        Ok(())
    }

    async fn ensure_network(&self, name: &str) -> Result<()> {
        self.enter("ensure_network", name)?;
        self.lock().networks.insert(name.to_owned());
        Ok(())
    }
}
