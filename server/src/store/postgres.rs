//! Postgres backend. (Being written.)
pub struct PgStore;
impl PgStore {
    pub async fn connect(_url: &str) -> super::StoreResult<Self> {
        Err(super::StoreError::Invalid {
            field: "database_url",
            message: "postgres store not built yet".into(),
        })
    }
}
