//! The launcher's hooks into the server: status changes through the one status function and
//! system metrics through the one ingest path, so launched runs look like any other run; run
//! tokens from the access rules.

use super::RunHooks;
use crate::live::LiveHub;
use crate::store::{DynStore, ExitInfo, MetricPoint, RunStatus};
use async_trait::async_trait;
use std::sync::Arc;

pub struct AppHooks {
    pub store: DynStore,
    pub live: Arc<LiveHub>,
}

#[async_trait]
impl RunHooks for AppHooks {
    async fn set_status(
        &self,
        run_id: &str,
        status: RunStatus,
        reason: &str,
        exit: Option<ExitInfo>,
    ) -> anyhow::Result<()> {
        crate::status::change_status(
            &*self.store,
            &self.live,
            run_id,
            status,
            Some(reason),
            exit,
            crate::status::Actor::Launcher,
        )
        .await?;
        Ok(())
    }

    async fn ingest(&self, run_id: &str, points: Vec<MetricPoint>) -> anyhow::Result<()> {
        crate::ingest::ingest_points(&*self.store, &self.live, run_id, &points).await?;
        Ok(())
    }

    async fn run_token(&self, run_id: &str) -> anyhow::Result<String> {
        Ok(crate::access::secret::issue_run_token(self.store.as_ref(), run_id).await?)
    }
}
