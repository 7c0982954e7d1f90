//! Registry handler (to be written): until then the resource's status says it is not
//! reconciled yet.

use crate::model::ResourceKey;
use crate::reconcile::{Ctx, Result, blocking};
use crate::runtime::Runtime;
use crate::store::ResourceStatus;

pub(super) async fn reconcile<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let status = ResourceStatus::new(
        "Unsupported",
        format!("this agent cannot reconcile {} resources yet", key.kind),
    );
    let key = key.clone();
    blocking(&ctx.store, move |store| store.put_status(&key, &status)).await
}
