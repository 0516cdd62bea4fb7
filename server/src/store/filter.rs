//! The run-search language (`q=`): parsed once, rendered per backend. (Being written; this
//! placeholder only fixes the parse signature the API codes against.)
#[derive(Debug, Clone, PartialEq)]
pub struct Filter;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("at position {position}: {message}")]
pub struct FilterError {
    pub position: usize,
    pub message: String,
}

impl Filter {
    pub fn parse(_text: &str) -> Result<Filter, FilterError> {
        Err(FilterError {
            position: 0,
            message: "filters are not available yet".into(),
        })
    }
}
