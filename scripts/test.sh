#!/usr/bin/env bash
# `make test`: lint, unit tests, then the end-to-end suite against real Docker, real vendor
# CLIs and the stub model. Cleans up every test object by label, also after a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Kubernetes tests (tests/e2e/kubernetes.rs) share one ../shared/k8s-lab for the whole
# suite: the first brings it up and marks it with CAW_BOX_K8S_LAB_RUN, the others reuse it (a
# lab without this suite's mark, a killed earlier run's, is brought up afresh). It is taken
# down here after the main stage, and at exit: also when the run failed or was killed mid-test.
CAW_BOX_K8S_LAB_RUN=test-sh-$(cat /proc/sys/kernel/random/uuid)
export CAW_BOX_K8S_LAB_RUN
# The lab's script, found as the tests find it: CAW_BOX_K8S_LAB, else shared/k8s-lab beside
# the checkout or one of its parent folders, else the machine's /work/shared.
lab_script() {
    local dir=$PWD
    if [ -n "${CAW_BOX_K8S_LAB:-}" ]; then echo "$CAW_BOX_K8S_LAB"; return; fi
    while [ "$dir" != / ]; do
        dir=$(dirname "$dir")
        if [ -x "$dir/shared/k8s-lab/k8s-lab" ]; then echo "$dir/shared/k8s-lab/k8s-lab"; return; fi
    done
    echo /work/shared/k8s-lab/k8s-lab
}
lab_down() {
    local lab
    lab=$(lab_script)
    # The tests' mark first: the lab's `down` removes /tmp/k8s-lab only when it is empty.
    rm -f /tmp/k8s-lab/caw-box-e2e-run
    if [ -x "$lab" ]; then "$lab" down >/dev/null 2>&1 || true; fi
}

# Where the time goes: each stage's wall time, and nextest's JUnit report of each test run,
# kept under target/test-timings/ and summed up at the end (scripts/test-summary.py).
target=${CARGO_TARGET_DIR:-target}
timings=$target/test-timings
rm -rf "$timings"
mkdir -p "$timings"
# stage NAME CMD...: runs CMD, recording its wall time and outcome. CMD runs where `set -e`
# does not reach (bash ignores it under `||`): a function given here chains its steps itself.
stage() {
    local name=$1 t0=$SECONDS rc=0
    shift
    echo "== $name"
    "$@" || rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" $((SECONDS - t0)) "$([ $rc = 0 ] && echo ok || echo "failed ($rc)")" \
        "${STAGE_BESIDE:-}" >>"$timings/stages.tsv"
    return $rc
}
# nt NAME ARGS...: `cargo nextest run ARGS...`, keeping its JUnit report as NAME.xml (nextest
# writes it under the workspace's own target/nextest, whatever CARGO_TARGET_DIR says).
nt() {
    local name=$1 rc=0
    shift
    cargo nextest run "$@" || rc=$?
    cp target/nextest/default/junit.xml "$timings/$name.xml" 2>/dev/null || true
    return $rc
}
finish() {
    local rc=$?
    set +e
    # A release build still running beside the stages (a failed or killed run) goes too.
    [ -z "${prebuild:-}" ] || kill -- -"$prebuild" 2>/dev/null
    # So does a Podman pass still running (its nextest stops its tests on SIGTERM).
    if [ -n "${podman_job:-}" ]; then
        pkill -TERM -P "$podman_job" 2>/dev/null
        wait "$podman_job" 2>/dev/null
    fi
    scripts/podman.sh down
    unset DOCKER_HOST
    scripts/cleanup.sh
    lab_down
    scripts/test-summary.py "$timings"
    exit $rc
}
trap finish EXIT

lint() {
    cargo fmt --all -- --check &&
        cargo clippy --workspace --all-targets --quiet -- -D warnings &&
        scripts/lint-workflows.sh &&
        scripts/lint-architecture.sh &&
        scripts/deny.sh &&
        node --test tests/proxy/
}
stage lint lint

images() {
    scripts/images.sh && scripts/rig.sh tools
}
stage images images

export CAW_BOX_RIG_PID_FILE=${CAW_BOX_RIG_DIR:-/var/tmp/caw-box-rig}/dockerd.pid
# The daemon-restart test restarts the Docker daemon under every other test: it runs alone.
# The installed-binary test runs `cargo install` over this target dir, which re-links
# target/debug/caw-box: a test starting caw-box at that moment finds no file. It runs alone.
alone='test(daemon_restart) | test(an_installed_caw_box_builds_its_images_and_runs_a_turn)'
# A failed test stage does not stop the run: the later stages still run (their results and
# times are in the summary), and the run fails at the end.
failed=()
tests() {
    local name=$1
    shift
    stage "$name" "$@" || failed+=("$name")
}
# The static musl release binary the stage dist ships (a whole-program-LTO build, about 300 s
# of CPU), built beside the main stage at the lowest CPU and I/O priority: it takes the CPU
# the end-to-end tests leave idle while they wait on containers, and little else. Its own
# lock (target/x86_64-unknown-linux-musl/release) is not the tests'. The stage dist builds it
# again, a no-op when this finished and the same build when it failed (its errors are said
# there). Its own process group, so that `finish` stops all of it.
prebuild_log=$timings/prebuild.log
# A session of its own is also a scheduling group of its own where the kernel groups by
# session (sched_autogroup), which would weigh it as much as the whole test run: the group
# gets nice 19 too.
setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 ionice -c 3 scripts/dist.sh binary' \
    >"$prebuild_log" 2>&1 &
prebuild=$!
tests main nt main --workspace --no-fail-fast --test-threads 3 \
    -E "not ($alone) & not binary(keyring)" "$@"
# No later stage runs a Kubernetes test: the lab's processes stop now rather than idle on
# through the rest of the run.
lab_down
tests installed nt installed --workspace --no-fail-fast \
    -E 'test(an_installed_caw_box_builds_its_images_and_runs_a_turn)' "$@"
# Every run names --workspace: features resolve as for the build above, so nothing is
# compiled again (a run of one package's tests resolves its own, and rebuilds their crates).
# The OS keyring tests run against a real Secret Service of their own.
tests keyring scripts/with-keyring.sh cargo nextest run --workspace --no-fail-fast --test keyring "$@"
cp target/nextest/default/junit.xml "$timings/keyring.xml" 2>/dev/null || true
tests restart nt restart --workspace --no-fail-fast --test-threads 1 -E 'test(daemon_restart)' "$@"

# The end-to-end tests whose code paths differ under Podman, once more against its
# Docker-compatible service (`podman system service`, started by the Podman rig with the
# same images): a new volume filled at first start, not at create (codex's config.toml,
# gemini's settings: the two session tests), stdin not kept across attaches (a broker per
# turn: the broker tests; the TUI), its stopped state and listing races (manage, control),
# ownership under its user namespace (and a root turn's container handing its new volume to
# root, with capabilities it drops before the entrypoint), copy mode's archive calls, the proxy network, and an
# installed binary building images through it. claude's and opencode's session tests take
# the same paths as codex's there, and run on Docker only. Protected paths (`protect::`) ask
# Podman for the same create body (nested read-only binds) as Docker: not here; the TUI
# test's quarantine runs here.
podman_tests=(
    'test(=sessions::codex_runs_a_tool_and_recalls_after_resume)'
    'test(=sessions::gemini_runs_a_tool_and_recalls_after_resume)'
    'test(manage::detach_wait_and_stop)'
    'test(manage::rm_and_gc)'
    'test(manage::two_racing_resumes_exactly_one_runs)'
    'test(manage::management_by_id_prefix_and_name_without_the_host_data_dir)'
    'test(sandbox::allow_host_admits_only_listed_hosts_through_the_proxy)'
    'test(sandbox::copy_mode_leaves_the_host_tree_alone_and_exports_and_diffs)'
    'test(sandbox::files_the_agent_creates_belong_to_a_non_1000_host_user)'
    'test(sandbox::as_root_the_agent_writes_and_commits_in_a_root_owned_checkout)'
    'test(control::interrupt_and_busy_session)'
    'test(bad_input::bad_input_is_refused_cleanly_and_creates_nothing)'
    'test(/^user_config::/)'
    'test(portable::an_exported_session_resumes_on_an_emptied_host_by_its_old_handle)'
    'test(interactive::codex_tui_session_resumes_headless_and_back)'
    'test(broker::broker_prompt_injection_dumps_no_secret)'
    'test(broker::broker_is_the_way_out_under_allow_host)'
)
filter=$(IFS='|'; echo "${podman_tests[*]}")
# `nt ARGS...` against the Podman rig's service: up first, its DOCKER_HOST set in this shell.
on_podman() {
    local env
    env=$(scripts/podman.sh up) || return
    eval "$env"
    nt "$@"
}
podman_pass() {
    on_podman podman --workspace --no-fail-fast --test-threads 3 --test e2e -E "${filter//|/ | }" "$@"
}
# The Python package: a fresh virtualenv, `pip install ./python`, pytest (python/tests).
tests python scripts/test-python.sh
# The Podman pass runs beside the stages after this one (dist, bench-smoke, targets), which
# use the Docker daemon: it has a service, storage and test objects of its own, and it mostly
# waits on containers. Not beside the python stage: there, while the wheel compiled on both
# cores, three Podman turns at once saw their model unreachable for a minute (2026-11-30),
# and pass alone. Its output goes to a log, printed when it has ended.
podman_log=$timings/podman.log
(STAGE_BESIDE=1 stage podman podman_pass "$@") >"$podman_log" 2>&1 &
podman_job=$!
# What a release publishes: `make dist`, then the static binary alone in a scratch image and
# the wheel in a fresh virtualenv, each running turns (scripts/test-dist.sh).
prebuilt() {
    local t0=$SECONDS
    wait "$prebuild" || echo "the release binary's build beside the main stage failed: the stage dist builds it"
    echo "waited $((SECONDS - t0)) s for the release binary's build beside the main stage"
}
prebuilt
tests dist scripts/test-dist.sh
tests bench-smoke scripts/bench.sh --smoke
# The documented targets and scripts no stage above runs (drift's plan, fuzz, the demo), so
# that none rots unseen, and CONTRIBUTING.md's table of what this run covers of each target.
tests targets scripts/test-targets.sh
echo "== podman (beside the stages above)"
wait "$podman_job" || failed+=(podman)
podman_job=
cat "$podman_log"
# Then, alone (see above; `cargo install` relinks target/debug/caw-box, which the stages
# above run), an installed caw-box building its images through Podman.
podman_installed() {
    local rc=0
    on_podman podman-installed --workspace --no-fail-fast --test e2e \
        -E 'test(release::an_installed_caw_box_builds_its_images_and_runs_a_turn)' "$@" || rc=$?
    scripts/podman.sh down
    unset DOCKER_HOST
    return $rc
}
tests podman-installed podman_installed "$@"
if [ ${#failed[@]} -gt 0 ]; then
    echo "make test: failed stages: ${failed[*]}" >&2
    exit 1
fi
