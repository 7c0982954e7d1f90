//! Unit tests of `convert`: each mapping, the notes, and that the output loads.
