//! SQLite backend. (Being written.)
pub struct SqliteStore;
impl SqliteStore {
    pub async fn connect(_url: &str) -> super::StoreResult<Self> {
        Err(super::StoreError::Invalid {
            field: "database_url",
            message: "sqlite store not built yet".into(),
        })
    }
}
