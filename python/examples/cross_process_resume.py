"""Cross-process resume, the coding-agent-wrapper way, with every turn in a container.

    python cross_process_resume.py start "Read src/ and plan the refactor." > handle.json
    # ... this process is gone; later, anywhere with the same Docker daemon:
    python cross_process_resume.py resume "Now do step 1." < handle.json

The handle alone is enough: nothing on this host needs to remember the session. The
settings are caw-box's: `caw-box run`'s flags as `Agent` keyword arguments, and anything
left out comes from the `CAW_BOX_*` variables and config files as on the command line
(CAW_BOX_PROVIDER, CAW_BOX_MODEL, CAW_BOX_ENDPOINT, CAW_BOX_NETWORK, ...). The API key is
passed from the host variable KEY_VAR names (default OPENAI_API_KEY) with every turn and is
never stored with the session.
"""

import os
import sys

import caw_box


def main() -> int:
    what, prompt = sys.argv[1], sys.argv[2]
    key = [os.environ.get("KEY_VAR", "OPENAI_API_KEY")]
    if what == "start":
        agent = caw_box.Agent(os.environ.get("PROVIDER"), env=key)  # None: CAW_BOX_PROVIDER
        with agent.start_session() as session:
            turn = session.send(prompt, check=True)
            print(turn.result, file=sys.stderr)
            print(session.resume_handle)
    else:
        session = caw_box.Agent.resume_session(sys.stdin.read().strip(), env=key)
        turn = session.send(prompt, check=True)
        print(turn.result)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except caw_box.CawBoxError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
