//! Hyperparameter search for Trainyard sweeps (work in progress).
