//! Where `caw-box image` works: the chosen backend's own image store, which builds, pulls,
//! lists and removes caw-box's images ([`ImageStore`]: a Docker daemon's). A cluster keeps
//! none that caw-box can build in (its nodes take images from a registry): there the image
//! commands are refused before anything is done, never quietly run against a Docker daemon
//! the cluster never sees.
//!
//! Not here: how a turn's image is found or reported missing (`Backend::inspect_image`,
//! `CreateError::ImageMissing`).

use std::collections::HashMap;

use super::{BackendKind, BackendSettings, DockerBackend, ImageInfo};
use crate::error::{Error, Result};

pub use super::docker::{BuildEvent, BuildSpec, BuildStream};

/// The chosen backend's image store.
#[derive(Clone)]
pub struct ImageStore(DockerBackend);

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImageStore(docker)")
    }
}

use super::docker::managed_filter;

impl ImageStore {
    /// Refuses (exit 2, with what to do) `caw-box image WHAT` where the backend `settings`
    /// name has no image store of its own.
    pub fn refuse_elsewhere(settings: &BackendSettings, what: &str) -> Result<()> {
        if settings.kind != BackendKind::Kubernetes {
            return Ok(());
        }
        Err(Error::usage(format!(
            "`caw-box image {what}` works on a Docker daemon's images, not a cluster's: a cluster's nodes take images from a registry"
        ))
        .with_hint(format!(
            "run `caw-box --backend docker image {what}`, push the images to a registry the nodes reach and set CAW_BOX_IMAGE_REPO (a test cluster: load them into its nodes, e.g. `k8s-lab load-image`)"
        )))
    }

    /// Connects to the image store of the backend `settings` name (after
    /// [`Self::refuse_elsewhere`]).
    pub async fn connect(settings: &BackendSettings) -> Result<Self> {
        DockerBackend::connect(settings).await.map(ImageStore)
    }

    /// Builds `spec`; dropping the stream cancels the build.
    pub fn build_image(&self, spec: BuildSpec) -> BuildStream<'_> {
        self.0.build_image(spec)
    }

    /// The image `image` (by name or id), or `None` when the store does not have it.
    pub async fn inspect_image(&self, image: &str) -> Result<Option<ImageInfo>> {
        self.0.inspect_image(image).await
    }

    /// Pulls `image` from its registry: the pull's last status line.
    pub async fn pull_image(&self, image: &str) -> Result<String> {
        self.0.pull_image(image).await
    }

    /// Tags image `id` as `tag` (`REPO/NAME:TAG`).
    pub async fn tag_image(&self, id: &str, tag: &str) -> Result<()> {
        self.0.tag_image(id, tag).await
    }

    /// Removes an image by id (never forced): `false` when the store keeps it (in use).
    pub async fn remove_image(&self, id: &str) -> Result<bool> {
        self.0.remove_image(id).await
    }

    /// caw-box's images.
    pub async fn managed(&self) -> Result<Vec<ImageInfo>> {
        self.0.list_images(managed_filter(false)).await
    }

    /// caw-box's untagged images that no running build may still remove itself.
    pub async fn leftovers(&self) -> Result<Vec<ImageInfo>> {
        self.0.leftover_images().await
    }

    /// The images carrying the label `key=value` (a build's builder stages).
    pub async fn labelled(&self, key: &str, value: &str) -> Result<Vec<ImageInfo>> {
        let filter = HashMap::from([("label".to_string(), vec![format!("{key}={value}")])]);
        self.0.list_images(filter).await
    }

    /// How many containers carry the label `key=value` (a build's step containers).
    pub async fn containers_labelled(&self, key: &str, value: &str) -> Result<usize> {
        let label = format!("{key}={value}");
        Ok(self.0.list_containers(&[label]).await?.len())
    }
}
