"""The metrics and getters this package implements, by OSWorld's names.

The importer (gh_local/osworld/check.py) reads these on the host to decide what a check may hand to the
guest; tests/osworld_guest/test_names.py proves every name here is implemented and nothing else is.
Keep this module free of imports: the host imports it without the guest's libraries.
"""

METRICS: frozenset[str] = frozenset({
    # general.py
    "exact_match", "match_in_list", "is_in_list", "check_include_exclude", "literal_match", "compare_text_file",
    "check_json_settings", "check_list",
})

GETTERS: frozenset[str] = frozenset({
    # getters/files.py, getters/commands.py
    "vm_file", "embedded_file", "content_from_vm_file", "rule", "rule_relativeTime", "time_diff_range",
    "vm_command_line", "vm_command_error",
})
