//! A stored OAuth login's JSON, as the broker deals with it: the placeholder login a CLI
//! gets instead of the real one, and the stored login updated with a refresh's tokens.
//! Shared by handing credentials to a turn (`auth::inject`) and by the store's write-back
//! (`auth::store`), which must never keep a file that holds a placeholder.

/// The expiry a placeholder login states: 2100-01-01, so the CLI never refreshes it.
pub const PLACEHOLDER_EXPIRY_SECS: u64 = 4_102_444_800;

/// What every placeholder (key or login token) contains: write-back never stores a file
/// holding it.
pub const PLACEHOLDER_MARK: &str = "cawbox-placeholder";

/// The value at a dotted JSON path.
pub fn json_at<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn json_set(v: &mut serde_json::Value, path: &str, new: serde_json::Value) -> bool {
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for k in &parts[..parts.len() - 1] {
        match cur.get_mut(*k) {
            Some(next) => cur = next,
            None => return false,
        }
    }
    match cur.as_object_mut() {
        Some(o) => {
            o.insert(parts[parts.len() - 1].to_string(), new);
            true
        }
        None => false,
    }
}

/// A JWT of `real`'s header and claims, with `exp` far off and `signature` for its signature
/// (unsigned: the CLI only decodes it). `None` when `real` is no JWT.
fn placeholder_jwt(real: &str, signature: &str) -> Option<String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = real.split('.');
    let (header, payload) = (parts.next()?, parts.next()?);
    let mut claims: serde_json::Value = serde_json::from_slice(&b64.decode(payload).ok()?).ok()?;
    claims
        .as_object_mut()?
        .insert("exp".into(), PLACEHOLDER_EXPIRY_SECS.into());
    let payload = b64.encode(serde_json::to_vec(&claims).ok()?);
    Some(format!("{header}.{payload}.{signature}"))
}

/// The login file the CLI gets instead of `real`, and its placeholder access token (made of
/// `stand_in`): no real token, a far expiry (a JWT-shaped access or identity token keeps its
/// claims, with a far `exp`), a fresh `last_refresh`; the rest, such as scopes and the
/// subscription type, as stored. `None` when `real` is not a login of `spec`'s shape.
pub fn placeholder_login(
    spec: &crate::auth::spec::OAuthSpec,
    real: &[u8],
    stand_in: &str,
) -> Option<(Vec<u8>, String)> {
    let mut v: serde_json::Value = serde_json::from_slice(real).ok()?;
    let access = json_at(&v, &spec.access)?.as_str()?.to_string();
    json_at(&v, &spec.refresh)?.as_str()?;
    let refresh = format!("{PLACEHOLDER_MARK}-refresh-not-a-token");
    let placeholder = match spec.expiry_unit.as_str() {
        "jwt" => placeholder_jwt(&access, stand_in)?,
        _ => stand_in.to_string(),
    };
    let mut ok = json_set(&mut v, &spec.access, placeholder.clone().into())
        && json_set(&mut v, &spec.refresh, refresh.into());
    match spec.expiry_unit.as_str() {
        "jwt" => {}
        "ms" => {
            ok &= json_set(
                &mut v,
                &spec.expiry,
                (PLACEHOLDER_EXPIRY_SECS * 1000).into(),
            )
        }
        _ => ok &= json_set(&mut v, &spec.expiry, PLACEHOLDER_EXPIRY_SECS.into()),
    }
    if let Some(path) = &spec.id_token {
        let id = json_at(&v, path)
            .and_then(|t| t.as_str())
            .map(str::to_string);
        if let Some(id) = id {
            let fake = placeholder_jwt(&id, &format!("{PLACEHOLDER_MARK}-id"))?;
            ok &= json_set(&mut v, path, fake.into());
        }
    }
    for path in &spec.clear {
        if json_at(&v, path).is_some_and(|k| !k.is_null()) {
            ok &= json_set(&mut v, path, serde_json::Value::Null);
        }
    }
    if let Some(path) = &spec.last_refresh {
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        ok &= json_set(&mut v, path, now.into());
    }
    ok.then(|| Some((serde_json::to_vec(&v).ok()?, placeholder)))
        .flatten()
}

/// `stored` with the tokens of a refresh: `None` unless its refresh token is `previous`
/// (another process stored a newer login meanwhile, or it is not a login).
pub fn refreshed_login(
    spec: &crate::auth::spec::OAuthSpec,
    stored: &[u8],
    previous: &str,
    tokens: &RefreshedTokens,
) -> Option<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(stored).ok()?;
    if json_at(&v, &spec.refresh)?.as_str()? != previous {
        return None;
    }
    let mut ok = json_set(&mut v, &spec.access, tokens.access.as_str().into())
        && json_set(&mut v, &spec.refresh, tokens.refresh.as_str().into());
    match spec.expiry_unit.as_str() {
        "jwt" => {}
        "ms" => ok &= json_set(&mut v, &spec.expiry, tokens.expires_ms.into()),
        _ => ok &= json_set(&mut v, &spec.expiry, (tokens.expires_ms / 1000).into()),
    }
    if let (Some(path), Some(id)) = (&spec.id_token, &tokens.id_token) {
        ok &= json_set(&mut v, path, id.as_str().into());
    }
    for path in &spec.clear {
        if json_at(&v, path).is_some_and(|k| !k.is_null()) {
            ok &= json_set(&mut v, path, serde_json::Value::Null);
        }
    }
    if let Some(path) = &spec.last_refresh {
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        ok &= json_set(&mut v, path, now.into());
    }
    ok.then(|| serde_json::to_vec(&v).ok()).flatten()
}

/// The tokens a broker's refresh gave.
pub struct RefreshedTokens {
    pub access: String,
    pub refresh: String,
    pub id_token: Option<String>,
    pub expires_ms: u64,
}

impl std::fmt::Debug for RefreshedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefreshedTokens")
            .field("expires_ms", &self.expires_ms)
            .finish_non_exhaustive()
    }
}
