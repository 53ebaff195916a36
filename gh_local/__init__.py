"""What plays both halves on one host: `gh-runner local`, `gh-runner validate`, the case file they read
and the report they write. Above gh_runner and gh_server, which never import it."""
