//! Per-kind decoders: voodu's field names, types, parser defaults and validation rules
//! (spec §2), one file per kind (declared by the kind table, `spec::for_each_kind!`), plus the parts several kinds share: `container.rs` (the §2.0
//! container fields) with `env.rs` (`env_file`), `workload.rs` (the long-running workloads'
//! fields, `init`, `drain` and webhook targets), `backup.rs` (a statefulset's `backup {}`),
//! `rollout.rs` (a deployment's `canary {}` / `blue_green {}`), `probe.rs` and `checks.rs`.
//!
//! Invariant: every rule voodu checks (at parse time or only later, at reconcile) is checked
//! here, at the line that breaks it, so a commit the agent accepts does not fail on the host
//! for a reason the manifest alone shows.

mod backup;
mod checks;
mod container;
mod env;
mod probe;
mod rollout;
mod workload;

use hcl::edit::structure::Block;

use super::Specs;
use super::reader::DecodeCx;
pub(in crate::manifest::decode) use container::check_build_image;
pub(in crate::manifest::decode) use deployment::deployment;
pub(in crate::manifest::decode) use ingress::ingress;
pub(in crate::manifest) use statefulset::statefulset_for_macro;

/// A kind's block decoder (`S`, its spec type): the resources one block of the kind
/// declares, its labels checked; `None` when its labels are wrong.
pub(in crate::manifest::decode) trait Decoder {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs>;
}

/// A kind's decoder: `Decoder::decode` of the kind's spec type.
pub(in crate::manifest::decode) type Decode = fn(&mut DecodeCx<'_>, &Block) -> Option<Specs>;

/// The decoders' modules, one per row of the kind table (`spec::for_each_kind!`), each the
/// kind's `Decoder`, and the lookup by block type.
macro_rules! decoders {
    ($($module:ident: $variant:ident($spec:ident)),* $(,)?) => {
        $(mod $module;)*

        /// The decoder of the block type `name` when it is a kind's.
        pub(in crate::manifest::decode) fn decoder(name: &str) -> Option<Decode> {
            $(if name == crate::model::Kind::$variant.as_str() {
                return Some(<crate::manifest::spec::$spec as Decoder>::decode);
            })*
            None
        }
    };
}
crate::manifest::spec::for_each_kind!(decoders);
