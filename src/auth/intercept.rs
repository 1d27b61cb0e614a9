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
mod tests {
    use super::*;

    #[test]
    fn the_leaf_is_signed_by_the_turns_ca_for_the_intercepted_hosts_only() {
        let hosts = vec!["chatgpt.com".to_string()];
        let tls = intercept_tls(&hosts).unwrap();
        let ca = openssl::x509::X509::from_pem(tls.ca_pem.as_bytes()).unwrap();
        let leaf = openssl::x509::X509::from_pem(tls.cert_pem.as_bytes()).unwrap();
        assert!(leaf.verify(&ca.public_key().unwrap()).unwrap());
        let names: Vec<String> = leaf
            .subject_alt_names()
            .unwrap()
            .iter()
            .filter_map(|n| n.dnsname().map(str::to_string))
            .collect();
        assert_eq!(names, hosts);
        // The key is the leaf's, and only the leaf's: the CA's key is gone.
        let key = openssl::pkey::PKey::private_key_from_pem(tls.key_pem.expose()).unwrap();
        assert!(leaf.public_key().unwrap().public_eq(&key));
        assert!(!ca.public_key().unwrap().public_eq(&key));
        assert!(!format!("{tls:?}").contains("PRIVATE"));
        // A second turn's CA is another one.
        let other = intercept_tls(&hosts).unwrap();
        assert_ne!(other.ca_pem, tls.ca_pem);
        assert!(!leaf
            .verify(
                &openssl::x509::X509::from_pem(other.ca_pem.as_bytes())
                    .unwrap()
                    .public_key()
                    .unwrap()
            )
            .unwrap());
        assert!(intercept_tls(&[]).is_none());
    }
}
