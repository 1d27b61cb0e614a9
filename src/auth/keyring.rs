//! The OS keyring (Secret Service on Linux, the login Keychain on macOS): being written.
