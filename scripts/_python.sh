# Sourced by demo.sh and test.sh: sets PY to a Python that pip may install into.
#
# Inside a virtual environment (activated or not): that one.  Otherwise the
# project's own .venv/, created on first use and reused after: a system
# Python such as Debian's refuses `pip install` outright (PEP 668,
# "externally-managed-environment"), and installing into it would be wrong
# anyway.  Needs only python3 (3.11+) and its venv module, or pip.

_in_venv() { "$1" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; }

if ! command -v python3 >/dev/null 2>&1; then
    echo "error: python3 not found; install Python 3.11 or newer" >&2
    exit 1
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: pyxds needs Python 3.11 or newer; python3 is $(python3 -V 2>&1)" >&2
    exit 1
fi

if _in_venv python3; then
    PY=python3
else
    PY=.venv/bin/python
    if [ ! -x "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
        rm -rf .venv
        echo "creating the project's virtual environment in .venv/ ..." >&2
        if ! python3 -m venv .venv >/dev/null 2>&1; then
            # No ensurepip (Debian without python3-venv): a bare venv, and the
            # system pip installs pip into it.
            rm -rf .venv
            python3 -m venv --without-pip .venv \
                && python3 -m pip --python "$PY" install --quiet --disable-pip-version-check pip \
                || {
                    rm -rf .venv
                    echo "error: cannot create .venv/: install python3-venv (Debian/Ubuntu: apt-get install python3-venv) or pip" >&2
                    exit 1
                }
        fi
    fi
fi
