//! A brokered login's refresh: the tokens a broker reports are stored, and the handoff that
//! keeps two brokers of one login from spending its refresh token twice.

use std::time::Duration;

use super::Broker;
use crate::backend::Backend;
use crate::provider::ProviderKind;

/// When the access token of login `v` expires (epoch ms; 0 when it does not say).
pub(super) fn expires_ms(o: &crate::auth::spec::OAuthSpec, v: &serde_json::Value) -> u64 {
    use crate::auth::inject::json_at;
    match o.expiry_unit.as_str() {
        "jwt" => {
            let token = json_at(v, &o.expiry).and_then(|x| x.as_str()).unwrap_or("");
            crate::auth::spec::jwt_exp(token).unwrap_or(0) * 1000
        }
        unit => {
            let n = json_at(v, &o.expiry)
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            if unit == "ms" {
                n
            } else {
                n * 1000
            }
        }
    }
}

/// The stored login of `p` as the broker keeps its tokens (`access`, `refresh`,
/// `expires_ms`, `id_token`), for a refresh handoff.
fn stored_tokens(p: ProviderKind) -> Option<serde_json::Value> {
    use crate::auth::inject::json_at;
    let o = crate::auth::spec::Spec::of(p).oauth?;
    let store = crate::auth::store::Store::open().ok()?;
    let real = store.file(p, &o.target)?;
    let v: serde_json::Value = serde_json::from_slice(real.expose()).ok()?;
    let text = |path: &str| {
        json_at(&v, path)
            .and_then(|x| x.as_str())
            .map(str::to_string)
    };
    Some(serde_json::json!({
        "access": text(&o.access)?,
        "refresh": text(&o.refresh)?,
        "expires_ms": expires_ms(&o, &v),
        "id_token": o.id_token.as_deref().and_then(text),
    }))
}

/// Seals `value` with `key` as the broker's `seal` does (base64 of iv | ciphertext | tag).
fn seal_json(key: &[u8; 32], value: &serde_json::Value) -> Option<String> {
    use base64::Engine;
    let iv: [u8; 12] = super::random_bytes();
    let mut raw = iv.to_vec();
    raw.extend_from_slice(&aes_gcm_seal(key, &iv, value.to_string().as_bytes())?);
    Some(base64::engine::general_purpose::STANDARD.encode(raw))
}

/// AES-256-GCM of `plain` under `key` and `iv`, no associated data: ciphertext | tag, as
/// node's `createCipheriv('aes-256-gcm')` in the broker writes and reads them.
fn aes_gcm_seal(key: &[u8; 32], iv: &[u8; 12], plain: &[u8]) -> Option<Vec<u8>> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).ok()?);
    let mut out = plain.to_vec();
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(*iv), Aad::empty(), &mut out)
        .ok()?;
    Some(out)
}

/// Opens what [`aes_gcm_seal`] made (ciphertext | tag); `None` if the tag does not match.
fn aes_gcm_open(key: &[u8; 32], iv: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).ok()?);
    let nonce = Nonce::try_assume_unique_for_key(iv).ok()?;
    let mut buf = sealed.to_vec();
    let plain = key.open_in_place(nonce, Aad::empty(), &mut buf).ok()?;
    Some(plain.to_vec())
}

/// How long a broker's refresh may hold the login's refresh lock, and how long another
/// waits for it.
const REFRESH_LOCK: Duration = Duration::from_secs(40);

/// Answers a broker's `caw-box-broker refresh? <slot> <id> <sealed>`: the stored login when
/// it is newer than the one the broker would refresh (another broker refreshed it: the
/// broker's refresh token is used up), else `go`, holding the login's refresh lock until
/// the broker reports `caw-box-broker refreshed` (its new tokens stored by then). The lock
/// is the backend's ([`Backend::hold_refresh`]): this host's turns on Docker, every host's
/// on Kubernetes.
async fn answer_refresh(
    backend: impl Backend,
    p: ProviderKind,
    seal: [u8; 32],
    id: String,
    sealed: String,
    answers: tokio::sync::mpsc::UnboundedSender<String>,
    refreshed: std::sync::Arc<tokio::sync::Notify>,
) {
    let Some(theirs) = open_sealed(&seal, &sealed).and_then(|v| {
        v.get("refresh")
            .and_then(|r| r.as_str())
            .map(str::to_string)
    }) else {
        return;
    };
    let lock = backend.hold_refresh(p.as_str(), REFRESH_LOCK).await;
    let Ok(stored) = tokio::task::spawn_blocking(move || stored_tokens(p)).await else {
        return;
    };
    let newer = stored.filter(|t| t["refresh"].as_str() != Some(theirs.as_str()));
    if let Some(sealed) = newer.and_then(|t| seal_json(&seal, &t)) {
        tracing::debug!("handed the credential broker the {p} login another one refreshed");
        let _ = answers.send(format!("handoff {id} {sealed}\n"));
        if let Some(lock) = lock {
            lock.release().await;
        }
        return;
    }
    let done = refreshed.notified();
    tokio::pin!(done);
    done.as_mut().enable();
    let _ = answers.send(format!("handoff {id} go\n"));
    if let Some(lock) = lock {
        let _ = tokio::time::timeout(REFRESH_LOCK, done).await;
        lock.release().await;
    }
}

/// Opens a `caw-box-broker login <slot> <sealed>` line with `key`: the refreshed tokens.
fn open_sealed(key: &[u8; 32], sealed: &str) -> Option<serde_json::Value> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(sealed.trim())
        .ok()?;
    if raw.len() < 12 + 16 {
        return None;
    }
    let (iv, rest) = raw.split_at(12);
    let plain = aes_gcm_open(key, iv, rest)?;
    serde_json::from_slice(&plain).ok()
}

/// Reads a broker's stdout for refreshed logins and stores each (under the store's lock;
/// only over the login it replaces, so every attached caw-box may try).
pub(super) struct LoginWatch<B: Backend> {
    /// Whose refresh lock the handoff holds.
    backend: B,
    provider: ProviderKind,
    seal: [u8; 32],
    seen: Vec<u8>,
    /// Lines for the broker's stdin (refresh handoff answers).
    answers: tokio::sync::mpsc::UnboundedSender<String>,
    /// Told when the broker reports a refresh done.
    refreshed: std::sync::Arc<tokio::sync::Notify>,
    /// The account its keys spend, whose windows it reports (`auth::windows`).
    account: Option<String>,
    /// The turn's part in its account's back-off.
    pacer: Option<super::pace::Pacer>,
}

impl<B: Backend> LoginWatch<B> {
    pub(super) async fn take(&mut self, bytes: &[u8]) {
        self.seen.extend_from_slice(bytes);
        while let Some(i) = self.seen.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.seen.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim();
            if let Some(json) = line.strip_prefix("caw-box-broker limits ") {
                if let Some(account) = &self.account {
                    if let Err(e) = crate::auth::windows::record(account, self.provider, json) {
                        tracing::debug!("could not keep the account's windows: {e}");
                    }
                }
                if let Some(pacer) = &self.pacer {
                    pacer.seen(json);
                }
                continue;
            }
            if line.starts_with("caw-box-broker refreshed ") {
                self.refreshed.notify_waiters();
                continue;
            }
            if let Some(asked) = line.strip_prefix("caw-box-broker refresh? ") {
                if let [_slot, id, sealed] = asked.split(' ').collect::<Vec<_>>()[..] {
                    tokio::spawn(answer_refresh(
                        self.backend.clone(),
                        self.provider,
                        self.seal,
                        id.to_string(),
                        sealed.to_string(),
                        self.answers.clone(),
                        self.refreshed.clone(),
                    ));
                }
                continue;
            }
            let Some(rest) = line.strip_prefix("caw-box-broker login ") else {
                continue;
            };
            let Some((_, sealed)) = rest.split_once(' ') else {
                continue;
            };
            let Some(t) = open_sealed(&self.seal, sealed) else {
                tracing::warn!("the credential broker reported a login caw-box cannot open");
                continue;
            };
            let field = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
            let previous = field("previous").unwrap_or_default();
            let tokens = crate::auth::inject::RefreshedTokens {
                access: field("access").unwrap_or_default(),
                refresh: field("refresh").unwrap_or_default(),
                id_token: field("id_token"),
                expires_ms: t
                    .get("expires_ms")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0),
            };
            let p = self.provider;
            let stored = tokio::task::spawn_blocking(move || {
                let store = crate::auth::store::Store::open()?;
                crate::auth::store::store_refresh(&store, p, &previous, &tokens)
            })
            .await;
            match stored {
                Ok(Ok(true)) => {
                    tracing::info!("stored the {p} login the credential broker refreshed")
                }
                Ok(Ok(false)) => tracing::debug!("a newer {p} login is stored already"),
                Ok(Err(e)) => tracing::warn!("could not store the refreshed {p} login: {e}"),
                Err(e) => tracing::warn!("could not store the refreshed {p} login: {e}"),
            }
        }
    }
}

impl<B: Backend> LoginWatch<B> {
    /// The reader of the stdout of a broker of `provider`'s login sealing with `seal`, on
    /// `backend`, and the lines it answers with.
    pub(super) fn new(
        backend: &B,
        provider: ProviderKind,
        seal: [u8; 32],
    ) -> (LoginWatch<B>, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (answers, to_broker) = tokio::sync::mpsc::unbounded_channel();
        let account = crate::auth::account::of(provider);
        let watch = LoginWatch {
            pacer: super::pace::Pacer::fly(account.as_deref()),
            backend: backend.clone(),
            provider,
            seal,
            seen: Vec::new(),
            answers,
            refreshed: std::sync::Arc::new(tokio::sync::Notify::new()),
            account,
        };
        (watch, to_broker)
    }
}

impl<B: Backend> LoginWatch<B> {
    /// Its turn's pace is `lease`'s in a shared broker.
    pub(super) fn for_lease(mut self, lease: &str) -> Self {
        if let Some(p) = &mut self.pacer {
            p.for_lease(lease);
        }
        self
    }

    /// The line that tells the broker when its turn may send, where that changed.
    pub(super) fn pace(&mut self) -> Option<String> {
        self.pacer.as_mut()?.tick()
    }
}

impl Broker {
    /// The reader of the broker's stdout for logins, and the lines it answers with.
    pub(super) fn watch<B: Backend>(
        &self,
        backend: &B,
    ) -> (LoginWatch<B>, tokio::sync::mpsc::UnboundedReceiver<String>) {
        LoginWatch::new(backend, self.provider, self.seal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sealed report (broker.js's layout: iv, ciphertext, tag) opens with the seal key only
    /// (the e2e oauth test opens those node sealed).
    #[test]
    fn a_sealed_login_opens_with_the_seal_key_only() {
        let key = [9u8; 32];
        let iv = [1u8; 12];
        let plain = br#"{"previous":"r1","access":"a2","refresh":"r2","expires_ms":5}"#;
        let ct_tag = aes_gcm_seal(&key, &iv, plain).unwrap();
        assert_eq!(ct_tag.len(), plain.len() + 16);
        // AES-256-GCM itself: the GCM specification's test case 14 (zero key, IV and block).
        let kat = aes_gcm_seal(&[0u8; 32], &[0u8; 12], &[0u8; 16]).unwrap();
        assert_eq!(
            super::super::hex(&kat),
            "cea7403d4d606b6e074ec5d3baf39d18d0d1c8a799996bf0265b98b5d48ab919"
        );
        use base64::Engine;
        let sealed = base64::engine::general_purpose::STANDARD.encode([&iv[..], &ct_tag].concat());
        let opened = open_sealed(&key, &sealed).unwrap();
        assert_eq!(opened["refresh"], "r2");
        assert!(open_sealed(&[8u8; 32], &sealed).is_none());
        assert!(open_sealed(&key, "bm90IHNlYWxlZA==").is_none());
        // What caw-box hands a broker (a refresh handoff) opens the same way.
        // A token long enough that random base64 never spells it ("r3" did, in 2% of runs).
        let token = "refresh-token-in-the-clear";
        let handed = seal_json(&key, &serde_json::json!({"access": "a3", "refresh": token}));
        let handed = handed.unwrap();
        assert_eq!(open_sealed(&key, &handed).unwrap()["refresh"], token);
        assert!(!handed.contains(token));
        assert!(open_sealed(&[8u8; 32], &handed).is_none());
    }

    /// Each seal's IV comes from the OS's CSPRNG: never a UUID's bytes, whose version and
    /// variant bits are fixed (random bytes look so once in 64).
    #[test]
    fn seal_ivs_are_random_bytes_not_uuids() {
        use base64::Engine;
        let ivs: Vec<Vec<u8>> = (0..16)
            .map(|_| {
                let sealed = seal_json(&[9u8; 32], &serde_json::json!({"a": 1})).unwrap();
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(sealed)
                    .unwrap();
                raw[..12].to_vec()
            })
            .collect();
        assert!(
            !ivs.iter().all(|iv| super::super::uuid_shaped(iv)),
            "{ivs:?}"
        );
        assert!(ivs.iter().skip(1).all(|iv| *iv != ivs[0]));
    }
}
