"""Image builds: linux-tiny (offline, from Debian packages) and windows-10 (unattended, from an ISO)."""
