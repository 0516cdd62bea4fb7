//! Regression forest for parameter importance (work in progress).
