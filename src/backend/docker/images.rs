//! Images: whether one is present, building one from a context, listing caw-box's.

use std::collections::HashMap;

use bollard::query_parameters::{
    BuildImageOptions, CreateImageOptions, ListImagesOptions, RemoveImageOptions,
};
use futures_util::StreamExt;

use super::{daemon_message, is_conflict, is_not_found, DockerBackend};
use crate::backend::ImageInfo;
use crate::error::Result;
use crate::labelling::labels;

/// What to build: a context (a tar made in memory), build args, labels and the tag.
#[derive(Debug, Clone, Default)]
pub struct BuildSpec {
    pub tag: String,
    pub context_tar: Vec<u8>,
    pub args: HashMap<String, String>,
    pub labels: HashMap<String, String>,
    pub no_cache: bool,
}

/// A running build's news; dropping it cancels the build.
pub type BuildStream<'a> =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = BuildEvent> + Send + 'a>>;

/// One piece of news from a running build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildEvent {
    /// Build output (one or more lines).
    Log(String),
    /// The build failed; the builder's own message.
    Failed(String),
}

/// caw-box's images, as Docker's image list filters them; `dangling`: only the untagged.
pub fn managed_filter(dangling: bool) -> HashMap<String, Vec<String>> {
    let mut f = HashMap::from([(
        "label".to_string(),
        vec![format!("{}=true", labels::MANAGED)],
    )]);
    if dangling {
        f.insert("dangling".to_string(), vec!["true".to_string()]);
    }
    f
}

impl DockerBackend {
    /// caw-box's untagged images: builder stages and replaced images of earlier caw-box
    /// versions (today's `image build` removes its own). A builder-stage image younger than
    /// an hour may belong to a build that is running now, which removes it itself: left
    /// alone.
    pub async fn leftover_images(&self) -> Result<Vec<ImageInfo>> {
        let now = crate::clock::now_secs() as i64;
        Ok(self
            .list_images(managed_filter(true))
            .await?
            .into_iter()
            .filter(|i| !(i.labels.contains_key(labels::STAGE) && now - i.created < 3600))
            .collect())
    }

    /// The image `image` (by name or id), or `None` when the host does not have it.
    pub async fn inspect_image(&self, image: &str) -> Result<Option<ImageInfo>> {
        match self.docker.inspect_image(image).await {
            Ok(i) => Ok(Some(ImageInfo {
                id: i.id.unwrap_or_default(),
                tags: i.repo_tags.unwrap_or_default(),
                labels: i.config.and_then(|c| c.labels).unwrap_or_default(),
                size_bytes: i.size.map_or(0, |s| s.max(0) as u64),
                created: 0,
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.failed(format_args!("inspect image '{image}'"), &e)),
        }
    }

    /// Builds an image with the legacy builder (no BuildKit: not every daemon has it): the
    /// build's news as it comes. Dropping the stream closes the connection, which cancels
    /// the build.
    pub fn build_image(&self, spec: BuildSpec) -> BuildStream<'_> {
        let options = BuildImageOptions {
            t: Some(spec.tag.clone()),
            buildargs: Some(spec.args),
            labels: Some(spec.labels),
            rm: true,
            forcerm: true,
            nocache: spec.no_cache,
            ..Default::default()
        };
        let stream = self.docker.build_image(
            options,
            None,
            Some(bollard::body_full(spec.context_tar.into())),
        );
        Box::pin(stream.flat_map(|item| {
            let events = match item {
                Ok(info) => info
                    .stream
                    .map(BuildEvent::Log)
                    .into_iter()
                    .chain(
                        info.error_detail
                            .and_then(|d| d.message)
                            .map(BuildEvent::Failed),
                    )
                    .collect(),
                Err(e) => vec![BuildEvent::Failed(daemon_message(&e))],
            };
            futures_util::stream::iter(events)
        }))
    }

    /// Pulls `image` (`REPO/NAME:TAG`) from its registry, with the credentials of the
    /// docker CLI's config for that registry when it has plain ones (`docker login`).
    /// Returns the pull's last status line.
    pub async fn pull_image(&self, image: &str) -> Result<String> {
        let (from, tag) = match image.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
            Some((f, t)) => (f.to_string(), t.to_string()),
            None => (image.to_string(), "latest".to_string()),
        };
        let credentials = super::endpoint::registry_credentials(&from);
        let mut stream = self.docker.create_image(
            Some(CreateImageOptions {
                from_image: Some(from),
                tag: Some(tag),
                ..Default::default()
            }),
            None,
            credentials,
        );
        let mut last = String::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    if let Some(message) = info.error_detail.and_then(|d| d.message) {
                        return Err(crate::error::Error::environment(format!(
                            "failed to pull '{image}': {message}"
                        )));
                    }
                    if let Some(s) = info.status {
                        last = s;
                    }
                }
                Err(e) => return Err(self.failed(format_args!("pull '{image}'"), &e)),
            }
        }
        Ok(last)
    }

    /// Tags image `id` as `tag` (`REPO/NAME:TAG`).
    pub async fn tag_image(&self, id: &str, tag: &str) -> Result<()> {
        let (repo, t) = tag.rsplit_once(':').unwrap_or((tag, "latest"));
        self.docker
            .tag_image(
                id,
                Some(bollard::query_parameters::TagImageOptions {
                    repo: Some(repo.to_string()),
                    tag: Some(t.to_string()),
                }),
            )
            .await
            .map_err(|e| self.failed(format_args!("tag image '{id}' as '{tag}'"), &e))
    }

    /// Top-level images matching Docker's image list `filters` (e.g. `label`, `dangling`).
    pub async fn list_images(
        &self,
        filters: HashMap<String, Vec<String>>,
    ) -> Result<Vec<ImageInfo>> {
        let images = self
            .docker
            .list_images(Some(ListImagesOptions {
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| self.failed("list images", &e))?;
        Ok(images
            .into_iter()
            .map(|img| ImageInfo {
                id: img.id,
                tags: img.repo_tags,
                labels: img.labels,
                size_bytes: img.size.max(0) as u64,
                created: img.created,
            })
            .collect())
    }

    /// Removes an image by id, with its untagged parents (never forced). `Ok(false)` when
    /// Docker keeps it: in use by a container, a parent of another image, or gone already.
    pub async fn remove_image(&self, id: &str) -> Result<bool> {
        match self
            .docker
            .remove_image(
                id,
                Some(RemoveImageOptions {
                    force: false,
                    noprune: false,
                    ..Default::default()
                }),
                None,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(false),
            Err(e) => Err(self.failed(format_args!("remove image '{id}'"), &e)),
        }
    }
}
