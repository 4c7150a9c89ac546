//! Guide (written below).
