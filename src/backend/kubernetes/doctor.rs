//! `caw-box doctor` on Kubernetes: the API server and where caw-box would work (context,
//! namespace), what RBAC lets this user do there (SelfSubjectAccessReview, the API's own
//! answer), the storage class a session's claim gets, the RuntimeClasses `--runtime` picks
//! from, and whether the nodes hold the provider images. Read-only: nothing is created but the access reviews, which the API
//! server does not keep.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};

pub use crate::backend::doctor::Check;

/// What caw-box does in its namespace: (verb, resource, subresource).
pub const NEEDED: &[(&str, &str, &str)] = &[
    ("get", "pods", ""),
    ("list", "pods", ""),
    ("create", "pods", ""),
    ("delete", "pods", ""),
    ("patch", "pods", ""),
    ("create", "pods", "attach"),
    ("get", "pods", "attach"),
    ("create", "pods", "exec"),
    ("get", "pods", "exec"),
    ("get", "pods", "log"),
    ("get", "persistentvolumeclaims", ""),
    ("list", "persistentvolumeclaims", ""),
    ("create", "persistentvolumeclaims", ""),
    ("delete", "persistentvolumeclaims", ""),
    ("get", "configmaps", ""),
    ("list", "configmaps", ""),
    ("create", "configmaps", ""),
    ("delete", "configmaps", ""),
];

/// What caw-box does in its namespace outside the core API group: (group, verb, resource).
/// A brokered login's refresh lock is a Lease (read, made, taken, renewed, released).
pub const NEEDED_IN_GROUPS: &[(&str, &str, &str)] = &[
    ("coordination.k8s.io", "get", "leases"),
    ("coordination.k8s.io", "create", "leases"),
    ("coordination.k8s.io", "update", "leases"),
];

/// `verb resource[/subresource]`.
fn permission(verb: &str, resource: &str, sub: &str) -> String {
    if sub.is_empty() {
        format!("{verb} {resource}")
    } else {
        format!("{verb} {resource}/{sub}")
    }
}

/// The report, and whether the API server answered at all (`false`: nothing else could be
/// checked).
pub async fn checks(
    settings: &crate::backend::BackendSettings,
    images: &[(String, String)],
) -> (Vec<Check>, bool) {
    let (context, namespace) = (
        settings.kube_context.as_deref(),
        settings.namespace.as_deref(),
    );
    let mut out = Vec::new();
    let (config, origin) = match context {
        Some(c) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(c.to_string()),
                ..Default::default()
            };
            match kube::Config::from_kubeconfig(&options).await {
                Ok(config) => (config, format!("context '{c}'")),
                Err(e) => {
                    out.push(Check::Problem(format!(
                        "kubernetes: cannot use the kubeconfig context '{c}': {e}; fix: `kubectl config get-contexts` lists them"
                    )));
                    return (out, false);
                }
            }
        }
        None => match kube::Config::infer().await {
            Ok(config) => {
                let current = kube::config::Kubeconfig::read()
                    .ok()
                    .and_then(|k| k.current_context);
                let origin = match current {
                    Some(c) => format!("current context '{c}'"),
                    None => "in-cluster service account".to_string(),
                };
                (config, origin)
            }
            Err(e) => {
                out.push(Check::Problem(format!(
                    "kubernetes: no configuration found: {e}; fix: set KUBECONFIG (or ~/.kube/config), or run inside a cluster"
                )));
                return (out, false);
            }
        },
    };
    let url = config.cluster_url.to_string();
    let namespace = namespace
        .map(str::to_string)
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = match kube::Client::try_from(config) {
        Ok(c) => c,
        Err(e) => {
            out.push(Check::Problem(format!(
                "kubernetes: cannot make a client for {url} ({origin}): {e}"
            )));
            return (out, false);
        }
    };
    let probe = client.list_core_api_versions();
    match tokio::time::timeout(Duration::from_secs(10), probe).await {
        Ok(Ok(_)) => out.push(Check::Ok(format!(
            "kubernetes: API server {url} ({origin}), namespace '{namespace}'"
        ))),
        Ok(Err(e)) => {
            out.push(Check::Problem(format!(
                "kubernetes: cannot reach the API server {url} ({origin}): {e}; fix: check KUBECONFIG and --context, and that the cluster is up"
            )));
            return (out, false);
        }
        Err(_) => {
            out.push(Check::Problem(format!(
                "kubernetes: the API server {url} ({origin}) did not answer within 10 s; fix: check that the cluster is up"
            )));
            return (out, false);
        }
    }

    // The namespace itself (reading it may be forbidden: then its pods' answers tell).
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Ok(None) = namespaces.get_opt(&namespace).await {
        out.push(Check::Problem(format!(
            "kubernetes: namespace '{namespace}' does not exist; fix: kubectl create namespace {namespace}, or pass --namespace"
        )));
    }

    out.push(rbac(&client, &namespace).await);
    out.push(storage(&client, settings.cluster.storage_class.as_deref()).await);
    out.push(runtime_classes(&client).await);
    out.extend(node_images(&client, images).await);
    (out, true)
}

/// Whether `verb resource/sub` is allowed in `namespace` (`None`: the review failed).
async fn allowed(
    client: &kube::Client,
    namespace: Option<&str>,
    verb: &str,
    resource: &str,
    sub: &str,
    group: &str,
) -> std::result::Result<bool, String> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: namespace.map(str::to_string),
                verb: Some(verb.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource: (!sub.is_empty()).then(|| sub.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &review).await {
        Ok(r) => Ok(r.status.is_some_and(|s| s.allowed)),
        Err(kube::Error::Api(e)) => Err(e.message),
        Err(e) => Err(e.to_string()),
    }
}

async fn rbac(client: &kube::Client, namespace: &str) -> Check {
    let mut missing = Vec::new();
    let core = NEEDED
        .iter()
        .map(|(verb, resource, sub)| ("", *verb, *resource, *sub));
    let grouped = NEEDED_IN_GROUPS
        .iter()
        .map(|(group, verb, resource)| (*group, *verb, *resource, ""));
    for (group, verb, resource, sub) in core.chain(grouped) {
        match allowed(client, Some(namespace), verb, resource, sub, group).await {
            Ok(true) => {}
            Ok(false) => missing.push(permission(verb, resource, sub)),
            Err(e) => {
                return Check::Problem(format!(
                    "rbac: cannot ask the API server what this user may do: {e}"
                ))
            }
        }
    }
    if missing.is_empty() {
        Check::Ok(format!(
            "rbac: every permission caw-box needs in namespace '{namespace}' ({} checked)",
            NEEDED.len() + NEEDED_IN_GROUPS.len()
        ))
    } else {
        Check::Problem(format!(
            "rbac: in namespace '{namespace}' this user may not: {}; fix: a Role with these rules, bound to the user (docs/kubernetes.md, \"Permissions\")",
            missing.join(", ")
        ))
    }
}

/// The storage class a session's claim gets: `class` (`CAW_BOX_STORAGE_CLASS`), else the
/// default.
async fn storage(client: &kube::Client, class: Option<&str>) -> Check {
    let classes: Api<StorageClass> = Api::all(client.clone());
    if let Some(name) = class {
        return match classes.get_opt(name).await {
            Ok(Some(c)) => Check::Ok(format!(
                "storage: class '{name}' (CAW_BOX_STORAGE_CLASS, provisioner {})",
                c.provisioner
            )),
            Ok(None) => Check::Problem(format!(
                "storage: class '{name}' (CAW_BOX_STORAGE_CLASS) does not exist; fix: `kubectl get storageclass` lists them, or unset it for the default"
            )),
            Err(e) => Check::Note(format!(
                "storage: cannot read class '{name}' ({}): a claim's binding will tell",
                short(&e)
            )),
        };
    }
    match classes.list(&ListParams::default()).await {
        Ok(list) => {
            let default = list.items.iter().find(|c| {
                c.metadata.annotations.as_ref().is_some_and(|a| {
                    [
                        "storageclass.kubernetes.io/is-default-class",
                        "storageclass.beta.kubernetes.io/is-default-class",
                    ]
                    .iter()
                    .any(|k| a.get(*k).map(String::as_str) == Some("true"))
                })
            });
            match default {
                Some(c) => Check::Ok(format!(
                    "storage: default class '{}' (provisioner {})",
                    c.metadata.name.clone().unwrap_or_default(),
                    c.provisioner
                )),
                None => Check::Problem(
                    "storage: no default storage class, so a session's claim would stay Pending; fix: set CAW_BOX_STORAGE_CLASS to one of `kubectl get storageclass`".to_string(),
                ),
            }
        }
        Err(e) => Check::Note(format!(
            "storage: cannot list storage classes ({}): a claim's binding will tell",
            short(&e)
        )),
    }
}

/// The cluster's RuntimeClasses, which `--runtime NAME` chooses from (a note: without one,
/// pods run on the nodes' default handler).
async fn runtime_classes(client: &kube::Client) -> Check {
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    match classes.list(&ListParams::default()).await {
        Ok(list) if !list.items.is_empty() => {
            let mut names: Vec<String> = list
                .items
                .iter()
                .map(|c| {
                    format!(
                        "{} (handler {})",
                        c.metadata.name.clone().unwrap_or_default(),
                        c.handler
                    )
                })
                .collect();
            names.sort();
            Check::Ok(format!("runtime classes: {}; --runtime NAME picks one", names.join(", ")))
        }
        Ok(_) => Check::Note(
            "runtime classes: none, so --runtime has nothing to pick (for gVisor, the cluster's admin adds a RuntimeClass whose handler is the nodes' runsc)".to_string(),
        ),
        Err(e) => Check::Note(format!(
            "runtime classes: cannot list them ({}): a turn pod's admission checks --runtime",
            short(&e)
        )),
    }
}

/// The API server's message, short.
fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(r) => r.reason.clone(),
        other => other.to_string(),
    }
}

/// The names an image may be listed under on a node (containerd lists the full name).
fn image_names(image: &str) -> Vec<String> {
    let tagged = if image
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':') || last.contains('@'))
    {
        image.to_string()
    } else {
        format!("{image}:latest")
    };
    let first = tagged.split('/').next().unwrap_or("");
    let has_registry = tagged.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut names = vec![tagged.clone()];
    if !has_registry {
        if tagged.contains('/') {
            names.push(format!("docker.io/{tagged}"));
        } else {
            names.push(format!("docker.io/library/{tagged}"));
        }
    }
    names
}

/// Whether an image name names a registry the nodes could pull from.
fn from_a_registry(image: &str) -> bool {
    let first = image.split('/').next().unwrap_or("");
    image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost")
}

/// How many images a kubelet lists in its node's status by default (`nodeStatusMaxImages`).
const LISTED_AT_MOST: usize = 50;

/// Per provider image: on every node, some, or none (the nodes' status lists their images,
/// updated within seconds of a change).
async fn node_images(client: &kube::Client, images: &[(String, String)]) -> Vec<Check> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = match nodes.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            return vec![Check::Note(format!(
                "images: cannot list the nodes ({}): a missing image shows when a turn's pod cannot start",
                short(&e)
            ))]
        }
    };
    let held: Vec<Vec<String>> = list
        .iter()
        .map(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.images.as_ref())
                .into_iter()
                .flatten()
                .flat_map(|i| i.names.clone().unwrap_or_default())
                .collect()
        })
        .collect();
    images
        .iter()
        .map(|(provider, image)| {
            let names = image_names(image);
            let on = held
                .iter()
                .filter(|node| node.iter().any(|n| names.contains(n)))
                .count();
            // A kubelet lists at most 50 images (`nodeStatusMaxImages`), the largest.
            let listed_all = held.iter().all(|node| node.len() < LISTED_AT_MOST);
            if on == held.len() && on > 0 {
                Check::Ok(format!("{provider}: image {image} on every node ({on})"))
            } else if !listed_all {
                Check::Note(format!(
                    "{provider}: image {image} listed on {on} of {} nodes (a node lists only its {LISTED_AT_MOST} largest images)",
                    held.len()
                ))
            } else if from_a_registry(image) {
                Check::Note(format!(
                    "{provider}: image {image} on {on} of {} nodes: the others pull it from its registry when a turn needs it",
                    held.len()
                ))
            } else {
                Check::Problem(format!(
                    "{provider}: image {image} on {on} of {} nodes and from no registry; fix: push it to a registry the nodes reach and set CAW_BOX_IMAGE_REPO (or load it into the nodes)",
                    held.len()
                ))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_found_under_the_names_a_node_lists() {
        assert_eq!(
            image_names("caw-box/codex:latest"),
            ["caw-box/codex:latest", "docker.io/caw-box/codex:latest"]
        );
        assert_eq!(
            image_names("caw-box/codex"),
            ["caw-box/codex:latest", "docker.io/caw-box/codex:latest"]
        );
        assert_eq!(
            image_names("ghcr.io/o/caw-box/codex:1"),
            ["ghcr.io/o/caw-box/codex:1"]
        );
        assert!(from_a_registry("ghcr.io/o/codex:1"));
        assert!(from_a_registry("localhost:5000/codex"));
        assert!(!from_a_registry("caw-box/codex:latest"));
    }

    #[test]
    fn the_permissions_are_named_as_kubectl_auth_can_i_takes_them() {
        assert_eq!(permission("create", "pods", "exec"), "create pods/exec");
        assert_eq!(permission("list", "configmaps", ""), "list configmaps");
        assert!(NEEDED.contains(&("patch", "pods", "")));
        assert!(NEEDED_IN_GROUPS.contains(&("coordination.k8s.io", "update", "leases")));
    }
}
