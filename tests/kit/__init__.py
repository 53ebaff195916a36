"""The suite's test kit: what more than one test folder needs, written once.

    net.py           a free loopback port; waiting until a server answers (gh-server's /healthz)
    scratch.py       scratch directories QEMU (uid libvirt-qemu) can reach, removed afterwards
    poll.py          waiting (async) until a condition holds, with a deadline
    libvirt.py       the libvirt daemon up, our domains by name prefix, a provider started and closed,
                     the leak check of a folder
    model_agents.py  `gh-runner local` against a scripted model server, and what every such run shows

Fixtures stay in the folders' conftest.py files (or tests/conftest.py); they are built from these.
"""
