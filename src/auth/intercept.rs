//! A turn's interception CA: for a login whose CLI reaches the vendor's host directly
//! (opencode's ChatGPT login, see `OAuthSpec::intercept`), caw-box makes a CA for the turn
//! and, signed by it, the certificate the turn's own broker presents for those hosts. Only
//! the CA's certificate (public) reaches the agent's container, and only that container
//! trusts it; the leaf's key goes to the broker on its stdin. Pure: no I/O.

use crate::auth::Secret;

/// A turn's CA certificate and the broker's certificate and key for the intercepted hosts
/// (PEM).
pub struct InterceptTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: Secret,
}

impl std::fmt::Debug for InterceptTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterceptTls")
            .field("key_pem", &"****")
            .finish_non_exhaustive()
    }
}

/// A fresh CA (its key dropped once the leaf is signed: nothing else can be signed by it)
/// and a server certificate for `hosts`, valid for two days. `None` when `hosts` is empty
/// or holds a name no certificate can carry.
pub fn intercept_tls(hosts: &[String]) -> Option<InterceptTls> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    if hosts.is_empty() {
        return None;
    }
    let now = time::OffsetDateTime::now_utc();
    let (from, until) = (
        now - time::Duration::hours(1),
        now + time::Duration::days(2),
    );
    let mut ca = CertificateParams::new(Vec::<String>::new()).ok()?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "caw-box turn interception CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca.not_before, ca.not_after) = (from, until);
    let ca_key = KeyPair::generate().ok()?;
    let ca_cert = ca.self_signed(&ca_key).ok()?;
    let mut leaf = CertificateParams::new(hosts.to_vec()).ok()?;
    leaf.distinguished_name.push(DnType::CommonName, &hosts[0]);
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    (leaf.not_before, leaf.not_after) = (from, until);
    let leaf_key = KeyPair::generate().ok()?;
    let cert = leaf.signed_by(&leaf_key, &Issuer::new(ca, ca_key)).ok()?;
    Some(InterceptTls {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: Secret::new(leaf_key.serialize_pem().into_bytes()),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A rustls client that trusts `ca_pem` alone (not the system's roots).
    pub(crate) fn client_trusting(ca_pem: &str) -> std::sync::Arc<rustls::ClientConfig> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        std::sync::Arc::new(config)
    }

    /// Whether a TLS handshake as `host` completes between a server holding `tls`'s leaf and
    /// key and a client trusting `ca_pem` only: the leaf is signed by that CA, names `host`,
    /// and the key is the leaf's.
    pub(crate) fn handshake_ok(tls: &InterceptTls, ca_pem: &str, host: &str) -> bool {
        use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(tls.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(tls.key_pem.expose()).unwrap(),
            )
            .unwrap();
        let mut server = rustls::ServerConnection::new(std::sync::Arc::new(server)).unwrap();
        let name = ServerName::try_from(host.to_string()).unwrap();
        let mut client = rustls::ClientConnection::new(client_trusting(ca_pem), name).unwrap();
        // Both ends in memory: shuttle records until the handshake ends or one side fails.
        for _ in 0..10 {
            let mut buf = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                server.read_tls(&mut rd).unwrap();
            }
            if server.process_new_packets().is_err() {
                return false;
            }
            let mut buf = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
            }
            if client.process_new_packets().is_err() {
                return false;
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return true;
            }
        }
        false
    }

    #[test]
    fn the_leaf_is_signed_by_the_turns_ca_for_the_intercepted_hosts_only() {
        let hosts = vec!["chatgpt.com".to_string()];
        let tls = intercept_tls(&hosts).unwrap();
        // Signed by the turn's CA, for chatgpt.com, and the key is the leaf's.
        assert!(handshake_ok(&tls, &tls.ca_pem, "chatgpt.com"));
        // For the intercepted hosts only.
        assert!(!handshake_ok(&tls, &tls.ca_pem, "api.openai.com"));
        // The key is the leaf's only: the CA's key is gone (the PEM holds one key).
        assert_eq!(
            tls.key_pem
                .expose()
                .windows(11)
                .filter(|w| w == b"BEGIN PRIVA")
                .count(),
            1
        );
        assert!(!format!("{tls:?}").contains("PRIVATE"));
        // A second turn's CA is another one, and does not vouch for this leaf.
        let other = intercept_tls(&hosts).unwrap();
        assert_ne!(other.ca_pem, tls.ca_pem);
        assert!(!handshake_ok(&tls, &other.ca_pem, "chatgpt.com"));
        assert!(intercept_tls(&[]).is_none());
    }
}
