//! Min/max-preserving downsampling. (Being written.)
