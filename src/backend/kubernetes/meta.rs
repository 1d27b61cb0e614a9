//! caw-box's labels on Kubernetes objects: whole as annotations (any value), and as
//! labels where Kubernetes takes the value (63 characters of `[A-Za-z0-9._-]`), which is
//! what listing selects on. Pure: no API calls.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::MANAGED_BY;
use crate::backend::VolumeInfo;

/// Whether Kubernetes takes `v` as a label value.
pub fn valid_label_value(v: &str) -> bool {
    v.len() <= 63
        && (v.is_empty()
            || (v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// Whether Kubernetes takes `k` as a label (or annotation) key: `[prefix/]name`.
pub fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
    });
    prefix_ok && !name.is_empty() && valid_label_value(name)
}

/// (labels, annotations) for caw-box's labels: every pair as an annotation (with a valid
/// key), the valid ones also as labels, plus `app.kubernetes.io/managed-by=caw-box`.
pub fn split(
    labels: &HashMap<String, String>,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut k8s = BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())]);
    let mut annotations = BTreeMap::new();
    for (k, v) in labels {
        if !valid_label_key(k) {
            continue;
        }
        annotations.insert(k.clone(), v.clone());
        if valid_label_value(v) {
            k8s.insert(k.clone(), v.clone());
        }
    }
    (k8s, annotations)
}

/// The annotation of a state claim whose HOME the image's was copied into (the
/// `seed-home` init container's marker is there): later turns' pods go without that
/// init container. The backend's own, not one of caw-box's labels.
pub const HOME_SEEDED: &str = "io.caw-box.home-seeded";

/// caw-box's labels of an object: its labels, overlaid by its annotations (which hold the
/// values that could not be labels), without Kubernetes' own.
pub fn merged(meta: &ObjectMeta) -> HashMap<String, String> {
    let ours = |k: &str| !k.contains("kubernetes.io/") && k != HOME_SEEDED;
    let mut out: HashMap<String, String> = meta
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != MANAGED_BY.0)
        .collect();
    for (k, v) in meta.annotations.clone().unwrap_or_default() {
        if ours(&k) {
            out.insert(k, v);
        }
    }
    out
}

pub fn volume(meta: &ObjectMeta) -> VolumeInfo {
    VolumeInfo {
        name: meta.name.clone().unwrap_or_default(),
        labels: merged(meta),
    }
}

/// The label selector of a `key=value` filter: the pairs Kubernetes can select on (the
/// others are checked by [`matches`]), always caw-box's own objects.
pub fn label_selector(filter: &[String]) -> String {
    let mut parts = vec![format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)];
    for f in filter {
        if let Some((k, v)) = f.split_once('=') {
            if valid_label_key(k) && valid_label_value(v) {
                parts.push(format!("{k}={v}"));
            }
        } else if valid_label_key(f) {
            parts.push(f.clone());
        }
    }
    parts.join(",")
}

/// Whether `labels` carry every `key=value` (or `key`) of `filter`.
pub fn matches(labels: &HashMap<String, String>, filter: &[String]) -> bool {
    filter.iter().all(|f| match f.split_once('=') {
        Some((k, v)) => labels.get(k).map(String::as_str) == Some(v),
        None => labels.contains_key(f.as_str()),
    })
}
