//! placeholder until the embedded master lands.
use super::{Backend, BackendError, Request};
use crate::clock::Clock;
use crate::reply::Reply;
use std::sync::Arc;
/// stub
pub struct EmbeddedBackend {
    name: String,
    _clock: Arc<dyn Clock>,
}
impl EmbeddedBackend {
    /// stub
    pub fn new(name: impl Into<String>, clock: Arc<dyn Clock>) -> EmbeddedBackend {
        EmbeddedBackend {
            name: name.into(),
            _clock: clock,
        }
    }
    /// stub
    pub fn execute(&self, _r: &Request) -> Reply {
        Reply::Nil
    }
}
impl Backend for EmbeddedBackend {
    fn name(&self) -> &str {
        &self.name
    }
    async fn call(&self, r: &Request) -> Result<Reply, BackendError> {
        Ok(self.execute(r))
    }
}
