//! TOPLOC (filled in next).
