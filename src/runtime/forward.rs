//! `forward!`: writes the methods of `Containers` and `Swarm` that a wrapper runtime (`guard`,
//! `informer`) passes on unchanged to the runtime it wraps, so a wrapper spells out only the
//! verbs it changes.
//!
//! `forward!(inner: list, start, …)` inside an `impl Containers for W<R>` (or `impl Swarm`)
//! writes, for each verb named, `async fn verb(&self, …) -> … { self.inner.verb(…).await }`
//! (`events` and `log_stream`, the verbs that are not `async`, return the inner runtime's stream), with the
//! signature the trait declares. A verb the trait has that the wrapper neither writes nor
//! names is a compile error (a missing trait item), so a verb added to a trait is a decision
//! in every wrapper.

/// See the module documentation.
macro_rules! forward {
    ($field:ident: $($verb:ident),+ $(,)?) => {
        $( $crate::runtime::forward::forward!(@verb $field $verb); )+
    };

    // Containers.
    (@verb $field:ident list) => {
        async fn list(
            &self,
            filter: &[(&str, &str)],
        ) -> $crate::runtime::Result<Vec<$crate::runtime::Container>> {
            self.$field.list(filter).await
        }
    };
    (@verb $field:ident list_by_id) => {
        async fn list_by_id(
            &self,
            ids: &[String],
        ) -> $crate::runtime::Result<Vec<$crate::runtime::Container>> {
            self.$field.list_by_id(ids).await
        }
    };
    (@verb $field:ident create) => {
        async fn create(
            &self,
            spec: &$crate::runtime::ContainerSpec,
        ) -> $crate::runtime::Result<String> {
            self.$field.create(spec).await
        }
    };
    (@verb $field:ident start) => {
        async fn start(&self, id: &str) -> $crate::runtime::Result<()> {
            self.$field.start(id).await
        }
    };
    (@verb $field:ident remove) => {
        async fn remove(&self, id: &str) -> $crate::runtime::Result<()> {
            self.$field.remove(id).await
        }
    };
    (@verb $field:ident stop) => {
        async fn stop(
            &self,
            id: &str,
            grace: ::std::time::Duration,
        ) -> $crate::runtime::Result<()> {
            self.$field.stop(id, grace).await
        }
    };
    (@verb $field:ident ensure_network) => {
        async fn ensure_network(&self, name: &str) -> $crate::runtime::Result<()> {
            self.$field.ensure_network(name).await
        }
    };
    (@verb $field:ident inspect) => {
        async fn inspect(&self, id: &str) -> $crate::runtime::Result<$crate::runtime::Inspection> {
            self.$field.inspect(id).await
        }
    };
    (@verb $field:ident wait) => {
        async fn wait(&self, id: &str) -> $crate::runtime::Result<i64> {
            self.$field.wait(id).await
        }
    };
    (@verb $field:ident logs) => {
        async fn logs(&self, id: &str, tail: usize) -> $crate::runtime::Result<String> {
            self.$field.logs(id, tail).await
        }
    };
    (@verb $field:ident exec) => {
        async fn exec(
            &self,
            id: &str,
            command: &[String],
        ) -> $crate::runtime::Result<$crate::runtime::ExecOutcome> {
            self.$field.exec(id, command).await
        }
    };
    (@verb $field:ident exec_piped) => {
        async fn exec_piped(
            &self,
            id: &str,
            command: &[String],
            stdin: Option<$crate::runtime::ExecInput>,
            stdout: Option<$crate::runtime::ExecOutput>,
        ) -> $crate::runtime::Result<$crate::runtime::ExecOutcome> {
            self.$field.exec_piped(id, command, stdin, stdout).await
        }
    };
    (@verb $field:ident volume_path) => {
        async fn volume_path(
            &self,
            name: &str,
        ) -> $crate::runtime::Result<Option<::std::path::PathBuf>> {
            self.$field.volume_path(name).await
        }
    };
    (@verb $field:ident ensure_volume) => {
        async fn ensure_volume(
            &self,
            name: &str,
            labels: &::std::collections::BTreeMap<String, String>,
        ) -> $crate::runtime::Result<$crate::runtime::Volume> {
            self.$field.ensure_volume(name, labels).await
        }
    };
    (@verb $field:ident list_volumes) => {
        async fn list_volumes(
            &self,
            filter: &[(&str, &str)],
        ) -> $crate::runtime::Result<Vec<$crate::runtime::Volume>> {
            self.$field.list_volumes(filter).await
        }
    };
    (@verb $field:ident connect_network) => {
        async fn connect_network(&self, id: &str, name: &str) -> $crate::runtime::Result<()> {
            self.$field.connect_network(id, name).await
        }
    };
    (@verb $field:ident remove_network) => {
        async fn remove_network(&self, name: &str) -> $crate::runtime::Result<()> {
            self.$field.remove_network(name).await
        }
    };
    (@verb $field:ident remove_volume) => {
        async fn remove_volume(&self, name: &str) -> $crate::runtime::Result<()> {
            self.$field.remove_volume(name).await
        }
    };
    (@verb $field:ident image_present) => {
        async fn image_present(&self, image: &str) -> $crate::runtime::Result<bool> {
            self.$field.image_present(image).await
        }
    };
    (@verb $field:ident image_info) => {
        async fn image_info(
            &self,
            image: &str,
        ) -> $crate::runtime::Result<Option<$crate::runtime::ImageInfo>> {
            self.$field.image_info(image).await
        }
    };
    (@verb $field:ident pull) => {
        async fn pull(
            &self,
            image: &str,
            auth: Option<&$crate::runtime::RegistryAuth>,
        ) -> $crate::runtime::Result<Option<String>> {
            self.$field.pull(image, auth).await
        }
    };
    (@verb $field:ident log_stream) => {
        fn log_stream(
            &self,
            id: &str,
            options: $crate::runtime::LogOptions,
        ) -> $crate::runtime::LogChunks {
            self.$field.log_stream(id, options)
        }
    };
    (@verb $field:ident events) => {
        fn events(&self, filter: &[(&str, &str)]) -> $crate::runtime::Events {
            self.$field.events(filter)
        }
    };
    (@verb $field:ident cpu_percent) => {
        async fn cpu_percent(&self, id: &str) -> $crate::runtime::Result<f64> {
            self.$field.cpu_percent(id).await
        }
    };

    // Swarm.
    (@verb $field:ident swarm_node) => {
        async fn swarm_node(&self) -> $crate::runtime::Result<Option<$crate::runtime::SwarmNode>> {
            self.$field.swarm_node().await
        }
    };
    (@verb $field:ident list_nodes) => {
        async fn list_nodes(&self) -> $crate::runtime::Result<Vec<$crate::runtime::Node>> {
            self.$field.list_nodes().await
        }
    };
    (@verb $field:ident ensure_overlay) => {
        async fn ensure_overlay(&self, name: &str) -> $crate::runtime::Result<()> {
            self.$field.ensure_overlay(name).await
        }
    };
    (@verb $field:ident list_services) => {
        async fn list_services(
            &self,
            filter: &[(&str, &str)],
        ) -> $crate::runtime::Result<Vec<$crate::runtime::Service>> {
            self.$field.list_services(filter).await
        }
    };
    (@verb $field:ident create_service) => {
        async fn create_service(
            &self,
            spec: &$crate::runtime::ServiceSpec,
            auth: Option<&$crate::runtime::RegistryAuth>,
        ) -> $crate::runtime::Result<String> {
            self.$field.create_service(spec, auth).await
        }
    };
    (@verb $field:ident update_service) => {
        async fn update_service(
            &self,
            id: &str,
            version: u64,
            spec: &$crate::runtime::ServiceSpec,
            auth: Option<&$crate::runtime::RegistryAuth>,
        ) -> $crate::runtime::Result<()> {
            self.$field.update_service(id, version, spec, auth).await
        }
    };
    (@verb $field:ident remove_service) => {
        async fn remove_service(&self, id: &str) -> $crate::runtime::Result<()> {
            self.$field.remove_service(id).await
        }
    };
    (@verb $field:ident list_tasks) => {
        async fn list_tasks(
            &self,
            service_id: &str,
        ) -> $crate::runtime::Result<Vec<$crate::runtime::Task>> {
            self.$field.list_tasks(service_id).await
        }
    };
    (@verb $field:ident task_logs) => {
        async fn task_logs(&self, task_id: &str, tail: usize) -> $crate::runtime::Result<String> {
            self.$field.task_logs(task_id, tail).await
        }
    };
    (@verb $field:ident create_config) => {
        async fn create_config(
            &self,
            name: &str,
            labels: &::std::collections::BTreeMap<String, String>,
            data: &[u8],
        ) -> $crate::runtime::Result<String> {
            self.$field.create_config(name, labels, data).await
        }
    };
    (@verb $field:ident list_configs) => {
        async fn list_configs(
            &self,
            filter: &[(&str, &str)],
        ) -> $crate::runtime::Result<Vec<$crate::runtime::SwarmConfig>> {
            self.$field.list_configs(filter).await
        }
    };
    (@verb $field:ident remove_config) => {
        async fn remove_config(&self, id: &str) -> $crate::runtime::Result<()> {
            self.$field.remove_config(id).await
        }
    };
}

pub(crate) use forward;
