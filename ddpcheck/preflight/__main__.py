"""``python -m ddpcheck.preflight ...``: the preflight command on its own."""

from ddpcheck.preflight.command import preflight

if __name__ == "__main__":
    preflight(prog_name="ddpcheck preflight")
