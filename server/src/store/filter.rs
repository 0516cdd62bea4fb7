//! The run-search language (`q=`): parsed once, rendered per backend. (Being written.)
#[derive(Debug, Clone, PartialEq)]
pub struct Filter;
