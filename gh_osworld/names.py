"""The metrics and getters this package implements, by OSWorld's names.

The importer (gh_local/osworld/check.py) reads these on the host to decide what a check may hand to the
guest; tests/osworld_guest/test_names.py proves every name here is implemented and nothing else is.
Keep this module free of imports: the host imports it without the guest's libraries.
"""

METRICS: frozenset[str] = frozenset({
    # general.py
    "exact_match", "fuzzy_match", "is_in_list", "check_include_exclude", "literal_match", "compare_text_file",
    "diff_text_file", "compare_config", "compare_python_pure_text", "compare_result_files", "file_contains",
    "check_line_number", "check_list", "check_csv", "check_json_settings", "check_json", "check_direct_json_object",
    "run_sqlite3", "is_utc_0", "is_in_vm_clickboard", "check_gnome_favorite_apps", "check_moved_jpgs",
    "compare_archive", "compare_zip_files",
    # metrics/table.py
    "compare_table", "compare_csv",
    # metrics/docs.py
    "compare_docx_files", "compare_docx_files_and_ignore_new_lines", "compare_docx_lines", "compare_docx_tables",
    "compare_docx_images", "compare_contains_image", "compare_line_spacing", "compare_font_names",
    "compare_subscript_contains", "contains_page_break", "has_page_numbers_in_footers", "is_first_line_centered",
    "check_tabstops", "check_italic_font_size_14", "evaluate_strike_through_last_paragraph",
    "evaluate_colored_words_in_tables", "check_highlighted_words", "compare_references", "find_default_font",
    # metrics/slides.py
    "compare_pptx_files", "check_image_stretch_and_center", "check_slide_orientation_Portrait", "check_transition",
    "check_page_number_colors", "evaluate_presentation_fill_to_rgb_distance", "check_presenter_console_disable",
    "check_auto_saving_time",
})

GETTERS: frozenset[str] = frozenset({
    # getters/files.py, getters/commands.py
    "vm_file", "embedded_file", "content_from_vm_file", "rule", "rule_relativeTime", "time_diff_range",
    "vm_command_line", "vm_command_error",
    # getters/desktop.py
    "vm_screen_size", "vm_window_size", "vm_wallpaper", "list_directory",
})

# metrics/table.py: the compare_table rule types implemented (the importer skips a task using any other).
# style evaluates conditional formats of the expression and cellIs types; a sheet with another type gives
# no verdict (OSWorld's own metric evaluates expression formats only).
TABLE_RULES: frozenset[str] = frozenset({
    "sheet_name", "sheet_data", "sheet_print", "sheet_fuzzy", "sparkline", "chart", "freeze", "zoom",
    "data_validation", "row_props", "col_props", "filter", "pivot_table", "check_cell", "style",
})
