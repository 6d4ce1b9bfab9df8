//! The user-space pooler.
