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
    "compare_archive", "compare_zip_files", "check_text_enlarged", "compare_time_in_speedtest_results",
    # pdf.py, epub.py
    "compare_pdfs", "compare_epub",
    # images.py
    "compare_images", "compare_image_list", "check_structure_sim", "check_structure_sim_resized",
    "check_brightness_decrease_and_structure_sim", "check_saturation_increase_and_structure_sim",
    "check_contrast_increase_and_structure_sim", "check_file_exists_and_structure_sim",
    "check_palette_and_structure_sim", "check_image_mirror", "check_green_background", "check_triangle_position",
    "check_image_size", "check_image_file_size",
    # chrome.py
    "is_expected_active_tab", "is_expected_url_pattern_match", "is_expected_search_query", "is_expected_tabs",
    "is_expected_bookmarks", "check_history_deleted", "is_cookie_deleted", "check_enabled_experiments",
    "check_font_size", "is_expected_installed_extensions", "is_shortcut_on_desktop",
    # vlc.py, gimp.py, thunderbird.py, vscode.py
    "is_vlc_playing", "is_vlc_recordings_folder", "is_vlc_fullscreen", "check_qt_bgcone", "check_qt_max_volume",
    "check_qt_minimal_view", "check_qt_slider_colours", "check_global_key_play_pause",
    "check_one_instance_when_started_from_file", "check_config_status", "check_thunderbird_prefs",
    "check_thunderbird_filter", "check_thunderbird_folder", "is_extension_installed", "check_json_keybindings",
    # a11y.py
    "check_accessibility_tree",
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
    # getters/chrome.py
    "open_tabs_info", "active_tab_info", "active_url_from_accessTree", "active_tab_url_parse", "url_dashPart",
    "bookmarks", "history", "cookie_data", "default_search_engine", "profile_name", "enabled_experiments",
    "chrome_language", "chrome_font_size", "enable_do_not_track", "enable_enhanced_safety_browsing",
    "new_startup_page", "data_delete_automacally", "find_unpacked_extension_path", "find_installed_extension_name",
    "shortcuts_on_desktop", "default_video_player",
    # getters/apps.py
    "vlc_config", "vlc_playing_info", "gimp_config_file",
    # getters/a11y.py
    "accessibility_tree", "vm_terminal_output",
})

# metrics/table.py: the compare_table rule types implemented (the importer skips a task using any other).
# style evaluates conditional formats of the expression and cellIs types; a sheet with another type gives
# no verdict (OSWorld's own metric evaluates expression formats only).
TABLE_RULES: frozenset[str] = frozenset({
    "sheet_name", "sheet_data", "sheet_print", "sheet_fuzzy", "sparkline", "chart", "freeze", "zoom",
    "data_validation", "row_props", "col_props", "filter", "pivot_table", "check_cell", "style",
})
