//! Credentials: what each vendor CLI needs (specs under auth/, compiled in), collecting it
//! from the host into caw-box's private store, and handing it to turns without leaks.

pub mod inject;
pub mod keyring;
pub mod secret;
pub mod spec;
pub mod store;

pub use secret::Secret;
