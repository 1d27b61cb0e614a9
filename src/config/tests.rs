//! Precedence (flags > variables > project file > user file > defaults), the file search,
//! and the one-line refusals of bad files.

use std::collections::HashMap;
use std::path::Path;

use super::*;
use crate::cli::SettingsArgs;
use crate::error::Result;

/// A home with a user file, a repository with a project file, and a subdirectory of it.
struct World {
    dir: tempfile::TempDir,
    env: HashMap<String, String>,
}

impl World {
    fn new(user: &str, project: &str) -> World {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".config/caw-box")).unwrap();
        std::fs::write(home.join(".config/caw-box/config.toml"), user).unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("src/deep")).unwrap();
        std::fs::write(repo.join(PROJECT_FILE), project).unwrap();
        let env = HashMap::from([("HOME".to_string(), home.display().to_string())]);
        World { dir, env }
    }

    fn workspace(&self) -> std::path::PathBuf {
        self.dir.path().join("repo/src/deep")
    }

    fn resolve(&self, flags: Layer) -> Result<Resolved> {
        let get = |k: &str| self.env.get(k).cloned();
        Resolved::from_sources(flags, &self.workspace(), &get)
    }

    fn origin(&self, r: &Resolved, key: Key) -> String {
        let root = self.dir.path().display().to_string();
        let (_, o) = r
            .table()
            .into_iter()
            .find(|(k, ..)| *k == key)
            .map(|(_, v, o)| (v, o))
            .unwrap();
        o.to_string().replace(&root, "<tmp>")
    }
}

fn model(r: &Resolved) -> Option<String> {
    r.str(Key::Model)
}

#[test]
fn flags_beat_variables_beat_the_project_file_beat_the_user_file() {
    let mut w = World::new("model = \"user\"\n", "model = \"project\"\n");
    let flags = |m: Option<&str>| {
        Layer::from_flags(
            None,
            None,
            &SettingsArgs {
                model: m.map(String::from),
                ..Default::default()
            },
        )
    };
    // Each row: what is set, and who wins.
    assert_eq!(
        model(&w.resolve(flags(Some("flag"))).unwrap()).as_deref(),
        Some("flag")
    );
    w.env.insert("CAW_BOX_MODEL".into(), "env".into());
    let r = w.resolve(flags(Some("flag"))).unwrap();
    assert_eq!(model(&r).as_deref(), Some("flag"));
    assert_eq!(w.origin(&r, Key::Model), "flag --model");
    let r = w.resolve(flags(None)).unwrap();
    assert_eq!(model(&r).as_deref(), Some("env"));
    assert_eq!(w.origin(&r, Key::Model), "env CAW_BOX_MODEL");
    w.env.remove("CAW_BOX_MODEL");
    let r = w.resolve(flags(None)).unwrap();
    assert_eq!(model(&r).as_deref(), Some("project"));
    assert_eq!(
        w.origin(&r, Key::Model),
        "project <tmp>/repo/.caw-box.toml:1"
    );
    std::fs::write(
        w.dir.path().join("repo").join(PROJECT_FILE),
        "memory = \"1g\"\n",
    )
    .unwrap();
    let r = w.resolve(flags(None)).unwrap();
    assert_eq!(model(&r).as_deref(), Some("user"));
    assert_eq!(
        w.origin(&r, Key::Model),
        "user <tmp>/home/.config/caw-box/config.toml:1"
    );
    std::fs::write(w.dir.path().join("home/.config/caw-box/config.toml"), "").unwrap();
    let r = w.resolve(flags(None)).unwrap();
    assert_eq!(model(&r), None);
    assert_eq!(w.origin(&r, Key::Model), "default");
}

#[test]
fn each_key_is_settled_on_its_own() {
    let w = World::new(
        "provider = \"codex\"\nmemory = \"2g\"\ncpus = 2\ntimeout = \"10m\"\nallow_host = [\"@provider\"]\n",
        "memory = 1073741824\nenv_pass = [\"OPENAI_API_KEY\"]\negress = \"locked\"\n",
    );
    let r = w.resolve(Layer::default()).unwrap();
    let args = r.settings_args(&SettingsArgs::default()).unwrap();
    assert_eq!(r.str(Key::Provider).as_deref(), Some("codex"));
    assert_eq!(args.memory.as_deref(), Some("1073741824"));
    assert_eq!(args.cpus, Some(2.0));
    assert_eq!(args.timeout.as_deref(), Some("10m"));
    assert_eq!(args.allow_host, vec!["@provider"]);
    assert_eq!(args.egress.as_deref(), Some("locked"));
    assert_eq!(r.env_pass(), vec!["OPENAI_API_KEY"]);
    // Defaults fill what nothing set; the image follows the provider.
    let table = r.table();
    let image = table.iter().find(|(k, ..)| *k == Key::Image).unwrap();
    assert_eq!(image.1, Some(Value::Str("caw-box/codex:latest".into())));
    assert_eq!(image.2, Origin::Default);
}

#[test]
fn a_list_from_a_flag_replaces_the_files_list() {
    let w = World::new("allow_host = [\"a.example.com\", \"b.example.com\"]\n", "");
    let flags = Layer::from_flags(
        None,
        None,
        &SettingsArgs {
            allow_host: vec!["c.example.com".into()],
            ..Default::default()
        },
    );
    let r = w.resolve(flags).unwrap();
    assert_eq!(
        r.settings_args(&SettingsArgs::default())
            .unwrap()
            .allow_host,
        vec!["c.example.com"]
    );
}

#[test]
fn the_project_file_is_searched_up_to_the_repository_root() {
    let w = World::new("", "model = \"p\"\n");
    let found = project_candidates(&w.workspace());
    let rel: Vec<_> = found
        .iter()
        .map(|p| p.strip_prefix(w.dir.path()).unwrap().display().to_string())
        .collect();
    assert_eq!(
        rel,
        vec![
            "repo/src/deep/.caw-box.toml",
            "repo/src/.caw-box.toml",
            "repo/.caw-box.toml"
        ]
    );
    // A file above the repository root is not the project's.
    std::fs::remove_file(w.dir.path().join("repo").join(PROJECT_FILE)).unwrap();
    std::fs::write(w.dir.path().join(PROJECT_FILE), "model = \"outside\"\n").unwrap();
    assert_eq!(model(&w.resolve(Layer::default()).unwrap()), None);
}

#[test]
fn the_user_file_follows_caw_box_config_and_xdg() {
    let env = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    };
    assert_eq!(
        user_file(&env(&[("HOME", "/h")])).unwrap(),
        Path::new("/h/.config/caw-box/config.toml")
    );
    assert_eq!(
        user_file(&env(&[("HOME", "/h"), ("XDG_CONFIG_HOME", "/x")])).unwrap(),
        Path::new("/x/caw-box/config.toml")
    );
    assert_eq!(
        user_file(&env(&[
            ("HOME", "/h"),
            ("XDG_CONFIG_HOME", "/x"),
            ("CAW_BOX_CONFIG", "/c.toml")
        ]))
        .unwrap(),
        Path::new("/c.toml")
    );
}

/// The error line, with the temp dir replaced.
fn refusal(user: &str, project: &str) -> String {
    let w = World::new(user, project);
    let e = w.resolve(Layer::default()).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
    e.to_string()
        .replace(&w.dir.path().display().to_string(), "<tmp>")
}

#[test]
fn bad_files_are_refused_naming_file_line_and_key() {
    assert!(refusal("", "model = \"m\"\nmodle = \"x\"\n")
        .starts_with("<tmp>/repo/.caw-box.toml:2: unknown field `modle`"),);
    assert_eq!(
        refusal("\n\nmemory = \"lots\"\n", ""),
        "<tmp>/home/.config/caw-box/config.toml:3: memory 'lots' is not a size; use e.g. 512m or 2g"
    );
    assert_eq!(
        refusal("", "cpus = \"two\"\n"),
        "<tmp>/repo/.caw-box.toml:1: cpus: invalid type: string \"two\", expected f64"
    );
    assert!(refusal("", "timeout = \"soon\"\n")
        .starts_with("<tmp>/repo/.caw-box.toml:1: timeout 'soon'"));
    assert!(refusal("", "network = \"none\"\n")
        .starts_with("<tmp>/repo/.caw-box.toml:1: network 'none'"));
    assert!(refusal("", "provider = \"gpt\"\n")
        .starts_with("<tmp>/repo/.caw-box.toml:1: unknown provider"));
    assert!(refusal("", "x = [\n").starts_with("<tmp>/repo/.caw-box.toml:"));
    assert!(
        refusal("", "env_pass = [\"A-B\"]\n").starts_with("<tmp>/repo/.caw-box.toml:1: env_pass")
    );
}

#[test]
fn secret_values_are_refused_without_showing_them() {
    let key = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx";
    for project in [
        format!("model = \"{key}\"\n"),
        format!("endpoint = \"https://gw.example.com/v1?key={key}\"\n"),
        format!("labels = {{ owner = \"{key}\" }}\n"),
        format!("allow_host = [\"ok.example.com\", \"{key}\"]\n"),
        // Refused before it is found to be an unknown key: the key is the message.
        format!("openai_api_key = \"{key}\"\n"),
        "[auth]\ntoken = \"abc\"\n".to_string(),
    ] {
        let line = refusal("", &project);
        assert!(
            line.contains("config files hold no secret values"),
            "{line}"
        );
        assert!(!line.contains("AbCdEf"), "the value leaked: {line}");
        assert!(line.starts_with("<tmp>/repo/.caw-box.toml:"), "{line}");
    }
    // In a variable it is no config file's business (variables are the place for keys).
    let mut w = World::new("", "");
    w.env.insert("CAW_BOX_MODEL".into(), "plain".into());
    assert!(w.resolve(Layer::default()).is_ok());
}

#[test]
fn variables_are_checked_like_their_flags() {
    let mut w = World::new("", "");
    w.env.insert("CAW_BOX_MEMORY".into(), "lots".into());
    let e = w.resolve(Layer::default()).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.message.starts_with("CAW_BOX_MEMORY 'lots'"), "{e}");
    w.env.remove("CAW_BOX_MEMORY");
    w.env.insert(
        "CAW_BOX_ALLOW_HOST".into(),
        "a.example.com, @provider".into(),
    );
    w.env.insert(
        "CAW_BOX_LABELS".into(),
        "team=ci,io.caw-box.managed=x".into(),
    );
    let r = w.resolve(Layer::default()).unwrap();
    assert_eq!(
        r.settings_args(&SettingsArgs::default())
            .unwrap()
            .allow_host,
        vec!["a.example.com", "@provider"]
    );
    assert_eq!(r.labels(), vec![("team".to_string(), "ci".to_string())]);
}

#[test]
fn user_config_is_a_yes_no_key_of_files_variables_and_run() {
    let mut w = World::new("user_config = true\n", "");
    let none = || Layer::from_flags(None, None, &SettingsArgs::default());
    let r = w.resolve(none()).unwrap();
    assert!(r.yes(Key::UserConfig));
    assert_eq!(
        w.origin(&r, Key::UserConfig),
        "user <tmp>/home/.config/caw-box/config.toml:1"
    );
    w.env.insert("CAW_BOX_USER_CONFIG".into(), "false".into());
    assert!(!w.resolve(none()).unwrap().yes(Key::UserConfig));
    let mut flags = none();
    flags.user_config_flag(true);
    assert!(w.resolve(flags).unwrap().yes(Key::UserConfig));
    w.env.insert("CAW_BOX_USER_CONFIG".into(), "maybe".into());
    let e = w.resolve(none()).unwrap_err();
    assert!(e.message.contains("is not true or false"), "{}", e.message);
    // Unset anywhere: no.
    let w = World::new("", "");
    assert!(!w.resolve(none()).unwrap().yes(Key::UserConfig));
}

#[test]
fn checkpoints_is_an_on_off_key_of_files_variables_and_flags() {
    let mut w = World::new("checkpoints = false\n", "");
    let flags = |on: Option<bool>| {
        Layer::from_flags(
            None,
            None,
            &SettingsArgs {
                checkpoints: on,
                ..Default::default()
            },
        )
    };
    let r = w.resolve(flags(None)).unwrap();
    let args = r.settings_args(&SettingsArgs::default()).unwrap();
    assert_eq!(args.checkpoints, Some(false));
    assert_eq!(
        w.origin(&r, Key::Checkpoints),
        "user <tmp>/home/.config/caw-box/config.toml:1"
    );
    w.env.insert("CAW_BOX_CHECKPOINTS".into(), "on".into());
    let r = w.resolve(flags(None)).unwrap();
    assert_eq!(
        r.settings_args(&SettingsArgs::default())
            .unwrap()
            .checkpoints,
        Some(true)
    );
    let r = w.resolve(flags(Some(false))).unwrap();
    assert_eq!(
        r.settings_args(&SettingsArgs::default())
            .unwrap()
            .checkpoints,
        Some(false)
    );
    w.env.insert("CAW_BOX_CHECKPOINTS".into(), "maybe".into());
    let e = w.resolve(flags(None)).unwrap_err();
    assert!(e.message.contains("is not on or off"), "{}", e.message);
    // Unset anywhere: on (nothing given; `config show` says the default).
    let w = World::new("", "");
    let r = w.resolve(flags(None)).unwrap();
    assert_eq!(
        r.settings_args(&SettingsArgs::default())
            .unwrap()
            .checkpoints,
        None
    );
    let shown = r.table().into_iter().find(|(k, ..)| *k == Key::Checkpoints);
    assert_eq!(shown.unwrap().1, Some(Value::Bool(true)));
}

#[test]
fn image_repo_is_a_layered_key_checked_as_a_repository() {
    let mut w = World::new(
        "image_repo = \"ghcr.io/me/caw-box\"\n",
        "image_repo = \"registry.example.com:5000/team/caw-box\"\n",
    );
    let r = w.resolve(Layer::default()).unwrap();
    assert_eq!(
        r.str(Key::ImageRepo).as_deref(),
        Some("registry.example.com:5000/team/caw-box")
    );
    assert_eq!(
        w.origin(&r, Key::ImageRepo),
        "project <tmp>/repo/.caw-box.toml:1"
    );
    w.env
        .insert("CAW_BOX_IMAGE_REPO".into(), "localhost:5000/x".into());
    let r = w.resolve(Layer::default()).unwrap();
    assert_eq!(r.str(Key::ImageRepo).as_deref(), Some("localhost:5000/x"));
    assert!(refusal("", "\nimage_repo = \"ghcr.io/me/caw-box:v1\"\n")
        .starts_with("<tmp>/repo/.caw-box.toml:2: image_repo 'ghcr.io/me/caw-box:v1' is not an image repository"));
    assert!(refusal("image_repo = \"Upper/Case\"\n", "")
        .contains("config.toml:1: image_repo 'Upper/Case'"));
}

#[test]
fn backend_comes_from_the_files_or_the_variable_and_must_be_known() {
    let mut w = World::new("backend = \"kubernetes\"\n", "");
    let r = w.resolve(Layer::default()).unwrap();
    assert_eq!(r.str(Key::Backend).as_deref(), Some("kubernetes"));
    w.env
        .insert("CAW_BOX_BACKEND".to_string(), "docker".to_string());
    assert_eq!(
        w.resolve(Layer::default())
            .unwrap()
            .str(Key::Backend)
            .as_deref(),
        Some("docker")
    );
    let bad = World::new("", "backend = \"nomad\"\n");
    let e = bad.resolve(Layer::default()).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("unknown backend 'nomad'"), "{e}");
}

/// The agent settings have config keys, checked like their flags, and reach `run`'s flags.
#[test]
fn agent_settings_come_from_config_files() {
    let w = World::new(
        "effort = \"low\"\n",
        "system_prompt = \"@prompts/reviewer.md\"\nappend_system_prompt = \"Be brief.\"\neffort = \"high\"\n",
    );
    let r = w.resolve(Layer::default()).unwrap();
    let args = r
        .settings_args(&crate::cli::SettingsArgs::default())
        .unwrap();
    assert_eq!(args.system_prompt.as_deref(), Some("@prompts/reviewer.md"));
    assert_eq!(args.append_system_prompt.as_deref(), Some("Be brief."));
    assert_eq!(
        args.effort.as_deref(),
        Some("high"),
        "the project file wins"
    );
    assert!(w
        .origin(&r, Key::Effort)
        .starts_with("project <tmp>/repo/.caw-box.toml:3"));

    let bad = World::new("", "effort = \"max\"\n");
    let e = bad.resolve(Layer::default()).unwrap_err();
    assert!(
        e.message.contains(":1") && e.message.contains("low, medium or high"),
        "{}",
        e.message
    );
    let empty = World::new("", "system_prompt = \" \"\n");
    assert!(empty.resolve(Layer::default()).is_err());
}

/// The tool settings have config keys, checked like their flags, and reach `run`'s flags.
#[test]
fn tool_settings_come_from_config_files() {
    let w = World::new(
        "tools = \"all\"\n",
        "tools = \"read,edit\"\nallow_tool = [\"WebFetch\"]\ndeny_tool = [\"Grep\", \"Glob\"]\n",
    );
    let r = w.resolve(Layer::default()).unwrap();
    let args = r
        .settings_args(&crate::cli::SettingsArgs::default())
        .unwrap();
    assert_eq!(
        args.tools.as_deref(),
        Some("read,edit"),
        "the project file wins"
    );
    assert_eq!(args.allow_tool, ["WebFetch"]);
    assert_eq!(args.deny_tool, ["Grep", "Glob"]);
    let mut settings = crate::session::record::SessionSettings::default();
    crate::settings::apply_overrides(&mut settings, &args).unwrap();
    let tools = settings.tools.unwrap();
    assert_eq!(
        tools.describe(),
        "read,edit; allow WebFetch; deny Grep,Glob"
    );

    let bad = World::new("", "tools = \"read,files\"\n");
    let e = bad.resolve(Layer::default()).unwrap_err();
    assert!(
        e.message.contains(":1") && e.message.contains("'files'"),
        "{}",
        e.message
    );
}

/// `protect` comes from any layer; `unprotect` from the user file, a variable or a flag,
/// never from a project file (a repository would lift its own protection).
#[test]
fn protected_paths_come_from_config_files_but_a_project_cannot_unprotect() {
    let mut w = World::new("unprotect = [\".vscode\"]\n", "protect = [\"Makefile\"]\n");
    let r = w.resolve(Layer::default()).unwrap();
    let args = r.settings_args(&SettingsArgs::default()).unwrap();
    assert_eq!(args.protect, ["Makefile"]);
    assert_eq!(args.unprotect, [".vscode"]);
    let mut settings = crate::session::record::SessionSettings::default();
    crate::settings::apply_overrides(&mut settings, &args).unwrap();
    let set = settings.protected_paths();
    assert!(set.contains(&"Makefile".to_string()) && !set.contains(&".vscode".to_string()));
    w.env
        .insert("CAW_BOX_UNPROTECT".into(), ".git/hooks, .idea".into());
    let r = w.resolve(Layer::default()).unwrap();
    assert_eq!(
        r.settings_args(&SettingsArgs::default()).unwrap().unprotect,
        [".git/hooks", ".idea"]
    );

    assert_eq!(
        refusal("", "model = \"m\"\nunprotect = [\".git/hooks\"]\n"),
        "<tmp>/repo/.caw-box.toml:2: unprotect: a project file cannot unprotect paths: the repository would lift its own protection; put `unprotect` in your user config file, or pass --unprotect PATH"
    );
    assert_eq!(
        refusal("protect = [\"../elsewhere\"]\n", ""),
        "<tmp>/home/.config/caw-box/config.toml:1: protect '../elsewhere' is not a path inside the workspace; name it relative to the workspace's top, e.g. .git/hooks"
    );
}

/// `prices`: the user file prices models (USD per million tokens); a project file cannot (a
/// repository would decide what its turns count against `--max-cost`), nor a bad number.
#[test]
fn prices_come_from_the_user_file_only() {
    let w = World::new(
        "[prices.\"gpt-6.2-sol\"]\ninput = 2.5\noutput = 10\ncache_read = 0.25\n",
        "model = \"m\"\n",
    );
    let r = w.resolve(Layer::default()).unwrap();
    let book = r.prices();
    let p = book["gpt-6.2-sol"];
    assert_eq!(
        (p.input, p.output, p.cache_read, p.cache_write),
        (2.5, 10.0, Some(0.25), None)
    );
    assert_eq!(
        refusal("", "[prices.m]\ninput = 0\noutput = 0\n"),
        "<tmp>/repo/.caw-box.toml:1: prices: a project file cannot set prices: the repository would decide what its turns count against --max-cost; put `prices` in your user config file"
    );
    assert!(refusal("[prices.m]\ninput = -1\noutput = 1\n", "")
        .contains("prices.\"m\".input is not a price"));
    assert!(refusal("[prices.m]\ninput = 1\n", "").contains("missing field `output`"));
}

/// MCP servers have a config table: a command or a URL, and the NAMES of the host variables
/// that hold their secrets; they reach `run`'s flags with those variables' values.
#[test]
fn mcp_servers_come_from_config_files() {
    let w = World::new(
        "[mcp.docs]\ncommand = \"node /user/mcp.js\"\n",
        "[mcp.docs]\ncommand = [\"node\", \"/workspace/tools/mcp.js\"]\nenv = [\"HOME\"]\n\n\
         [mcp.search]\nurl = \"http://search:8080/mcp\"\nheaders = [\"Authorization=HOME\"]\n",
    );
    let r = w.resolve(Layer::default()).unwrap();
    assert!(w
        .origin(&r, Key::Mcp)
        .starts_with("project <tmp>/repo/.caw-box.toml:"));
    let home = std::env::var("HOME").unwrap();
    let args = r
        .settings_args(&crate::cli::SettingsArgs::default())
        .unwrap();
    assert_eq!(
        args.mcp,
        [
            "docs=node /workspace/tools/mcp.js",
            "search=http://search:8080/mcp"
        ]
    );
    assert_eq!(args.mcp_env, [format!("docs:HOME={home}")]);
    assert_eq!(args.mcp_header, [format!("search:Authorization={home}")]);
    let mut settings = crate::session::record::SessionSettings::default();
    crate::settings::apply_overrides(&mut settings, &args).unwrap();
    assert_eq!(settings.mcp.len(), 2);
    assert_eq!(settings.mcp[0].env, ["HOME"]);
    assert_eq!(settings.mcp[1].headers, ["Authorization"]);
    // The values travel like --env values, under the names the CLI's config names.
    let env = r.mcp_env_for(&settings.mcp).unwrap();
    assert!(env.contains(&("HOME".to_string(), home.clone())));
    assert!(env.contains(&(
        crate::agent_config::mcp_header_var("search", "Authorization"),
        home.clone()
    )));
    // A session that uses only one of the servers gets only that server's secret; one that
    // uses none (started before the file named them, or with other --mcp) gets none.
    assert_eq!(
        r.mcp_env_for(&settings.mcp[..1]).unwrap(),
        [("HOME".to_string(), home)]
    );
    assert!(r.mcp_env_for(&[]).unwrap().is_empty());
    // `config show` names the variables, never their values.
    let shown = r.get(Key::Mcp).unwrap().display();
    assert_eq!(
        shown,
        "docs=node /workspace/tools/mcp.js (env HOME); search=http://search:8080/mcp (headers Authorization=HOME)"
    );

    // A flag wins over the files, as for every key, and its secrets stay its own.
    let flags = crate::cli::SettingsArgs {
        mcp: vec!["other=http://other:1/mcp".into()],
        ..Default::default()
    };
    let r = w.resolve(Layer::from_flags(None, None, &flags)).unwrap();
    assert_eq!(
        r.settings_args(&flags).unwrap().mcp,
        ["other=http://other:1/mcp"]
    );
    assert!(r.mcp_env_for(&settings.mcp).unwrap().is_empty());
}

#[test]
fn mcp_config_refusals() {
    for (project, says) in [
        // A secret value, where a variable's name belongs: the usual refusal.
        ("[mcp.s]\nurl = \"http://s/mcp\"\nheaders = [\"Authorization=sk-ant-api03-abcdefghijklmnopqrstuvwxyz\"]\n", "looks like an API key"),
        ("[mcp.s]\nurl = \"http://s/mcp\"\nheaders = [\"Authorization=Bearer x\"]\n", "not NAME=VALUE"),
        ("[mcp.s]\ncommand = \"x\"\nurl = \"http://s/mcp\"\n", "either command or url"),
        ("[mcp.s]\nurl = \"http://s/mcp\"\nenv = [\"X\"]\n", "takes headers"),
        ("[mcp.s]\ncommand = \"x\"\nheaders = [\"A=B\"]\n", "a command takes env"),
        ("[mcp.s]\ncommand = \"x\"\ntoken = \"y\"\n", "token"),
        ("[mcp.\"bad name\"]\ncommand = \"x\"\n", "not a server name"),
    ] {
        let w = World::new("", project);
        let e = w.resolve(Layer::default()).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message.contains(says), "{project}: {}", e.message);
        assert!(!e.message.contains("abcdefghij"), "{}", e.message);
    }
    // A variable the file names but the host lacks: refused when the turn needs it.
    let w = World::new(
        "",
        "[mcp.s]\ncommand = \"x\"\nenv = [\"CAW_BOX_TEST_SURELY_UNSET_VAR\"]\n",
    );
    let r = w.resolve(Layer::default()).unwrap();
    let e = r
        .settings_args(&crate::cli::SettingsArgs::default())
        .unwrap_err();
    assert!(
        e.message.contains("CAW_BOX_TEST_SURELY_UNSET_VAR"),
        "{}",
        e.message
    );
}

#[test]
fn a_project_file_may_close_egress_but_not_open_it() {
    for (project, key) in [
        ("egress = \"open\"\n", "egress"),
        ("egress = \"balanced\"\n", "egress"),
        ("allow_host = [\"evil.example.com\"]\n", "allow_host"),
    ] {
        let line = refusal("", project);
        assert!(
            line.starts_with(&format!("<tmp>/repo/.caw-box.toml:1: {key}")),
            "{line}"
        );
        assert!(line.contains("open its own agent's egress"), "{line}");
    }
    // `locked` narrows whatever the person chose; the user's file may say anything.
    let w = World::new("egress = \"open\"\n", "egress = \"locked\"\n");
    let r = w.resolve(Layer::default()).unwrap();
    let args = r.settings_args(&SettingsArgs::default()).unwrap();
    assert_eq!(args.egress.as_deref(), Some("locked"));
    let w = World::new("egress = \"open\"\n", "");
    let r = w.resolve(Layer::default()).unwrap();
    assert_eq!(
        r.settings_args(&SettingsArgs::default())
            .unwrap()
            .egress
            .as_deref(),
        Some("open")
    );
    // A policy's name is checked where it was written.
    let mut w = World::new("", "");
    w.env.insert("CAW_BOX_EGRESS".into(), "closed".into());
    let e = w.resolve(Layer::default()).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.message.starts_with("CAW_BOX_EGRESS 'closed'"), "{e}");
}

#[test]
fn per_account_comes_from_the_person_not_the_repository() {
    let line = refusal("", "per_account = 0\n");
    assert!(
        line.starts_with("<tmp>/repo/.caw-box.toml:1: per_account"),
        "{line}"
    );
    let w = World::new("per_account = 3\n", "");
    let r = w.resolve(Layer::default()).unwrap();
    let args = r.settings_args(&SettingsArgs::default()).unwrap();
    assert_eq!(args.per_account, Some(3));
    let mut w = World::new("per_account = 3\n", "");
    w.env.insert("CAW_BOX_PER_ACCOUNT".into(), "2".into());
    let r = w.resolve(Layer::default()).unwrap();
    let args = r.settings_args(&SettingsArgs::default()).unwrap();
    assert_eq!(args.per_account, Some(2));
    for bad in ["-1", "lots", "1001"] {
        let mut w = World::new("", "");
        w.env.insert("CAW_BOX_PER_ACCOUNT".into(), bad.into());
        let e = w.resolve(Layer::default()).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{bad}");
        assert!(e.message.starts_with("CAW_BOX_PER_ACCOUNT"), "{e}");
    }
}
