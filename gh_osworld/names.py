"""The metrics and getters this package implements, by OSWorld's names, each under the module that
implements it.

The importer (gh_local/osworld/check.py) reads these on the host to decide what a check may hand to the
guest; the guest's registry imports only the modules a check names (a check of a command's output does
not pay for pandas: a tenth of a second against two under TCG's slower clock). tests/osworld_guest/
test_names.py proves every module registers exactly the names listed under it.
Keep this module free of imports: the host imports it without the guest's libraries.
"""

# The video types whose default application OSWorld asks xdg-mime about (the default_video_player getter);
# the importer's baseline gives OSWorld's snapshot's player the same types (gh_local/osworld/baseline.py).
VIDEO_TYPES = ("3gp", "3gpp", "3gpp2", "avi", "divx", "dv", "fli", "flv", "mp2t", "mp4", "mp4v-es", "mpeg",
               "mpeg-system", "msvideo", "ogg", "quicktime", "vnd.divx", "vnd.mpegurl", "vnd.rn-realvideo", "webm",
               "x-anim", "x-avi", "x-flc", "x-fli", "x-flv", "x-m4v", "x-matroska", "x-mpeg", "x-mpeg-system",
               "x-mpeg2", "x-ms-asf", "x-ms-asf-plugin", "x-ms-asx", "x-ms-wm", "x-ms-wmv", "x-ms-wmx", "x-ms-wvx",
               "x-msvideo", "x-nsv", "x-ogm", "x-ogm+ogg", "x-theora", "x-theora+ogg")

METRIC_MODULES: dict[str, frozenset[str]] = {
    "metrics.a11y": frozenset({
        "check_accessibility_tree"
    }),
    "metrics.chrome": frozenset({
        "check_enabled_experiments", "check_font_size", "check_history_deleted", "is_cookie_deleted",
        "is_expected_active_tab", "is_expected_bookmarks", "is_expected_installed_extensions",
        "is_expected_search_query", "is_expected_tabs", "is_expected_url_pattern_match", "is_shortcut_on_desktop"
    }),
    "metrics.docs": frozenset({
        "check_highlighted_words", "check_italic_font_size_14", "check_tabstops", "compare_contains_image",
        "compare_docx_files", "compare_docx_files_and_ignore_new_lines", "compare_docx_images",
        "compare_docx_lines", "compare_docx_tables", "compare_font_names", "compare_line_spacing",
        "compare_references", "compare_subscript_contains", "contains_page_break",
        "evaluate_colored_words_in_tables", "evaluate_strike_through_last_paragraph", "find_default_font",
        "has_page_numbers_in_footers", "is_first_line_centered"
    }),
    "metrics.epub": frozenset({
        "compare_epub"
    }),
    "metrics.general": frozenset({
        "check_csv", "check_direct_json_object", "check_gnome_favorite_apps", "check_include_exclude", "check_json",
        "check_json_settings", "check_line_number", "check_list", "check_moved_jpgs", "check_text_enlarged",
        "compare_archive", "compare_config", "compare_python_pure_text", "compare_result_files",
        "compare_text_file", "compare_time_in_speedtest_results", "compare_zip_files", "diff_text_file",
        "exact_match", "file_contains", "fuzzy_match", "is_in_list", "is_in_vm_clickboard", "is_utc_0",
        "literal_match", "run_sqlite3"
    }),
    "metrics.gimp": frozenset({
        "check_config_status"
    }),
    "metrics.images": frozenset({
        "check_brightness_decrease_and_structure_sim", "check_contrast_increase_and_structure_sim",
        "check_file_exists_and_structure_sim", "check_green_background", "check_image_file_size",
        "check_image_mirror", "check_image_size", "check_palette_and_structure_sim",
        "check_saturation_increase_and_structure_sim", "check_structure_sim", "check_structure_sim_resized",
        "check_triangle_position", "compare_image_list", "compare_images"
    }),
    "metrics.pdf": frozenset({
        "compare_pdfs"
    }),
    "metrics.slides": frozenset({
        "check_auto_saving_time", "check_image_stretch_and_center", "check_page_number_colors",
        "check_presenter_console_disable", "check_slide_orientation_Portrait", "check_transition",
        "compare_pptx_files", "evaluate_presentation_fill_to_rgb_distance"
    }),
    "metrics.table": frozenset({
        "compare_csv", "compare_table"
    }),
    "metrics.thunderbird": frozenset({
        "check_thunderbird_filter", "check_thunderbird_folder", "check_thunderbird_prefs"
    }),
    "metrics.vlc": frozenset({
        "check_global_key_play_pause", "check_one_instance_when_started_from_file", "check_qt_bgcone",
        "check_qt_max_volume", "check_qt_minimal_view", "check_qt_slider_colours", "is_vlc_fullscreen",
        "is_vlc_playing", "is_vlc_recordings_folder"
    }),
    "metrics.vscode": frozenset({
        "check_json_keybindings", "is_extension_installed"
    }),
}

GETTER_MODULES: dict[str, frozenset[str]] = {
    "getters.a11y": frozenset({
        "accessibility_tree", "vm_terminal_output"
    }),
    "getters.apps": frozenset({
        "gimp_config_file", "vlc_config", "vlc_playing_info"
    }),
    "getters.chrome": frozenset({
        "active_tab_info", "active_tab_url_parse", "active_url_from_accessTree", "bookmarks", "chrome_font_size",
        "chrome_language", "cookie_data", "data_delete_automacally", "default_search_engine",
        "default_video_player", "enable_do_not_track", "enable_enhanced_safety_browsing", "enabled_experiments",
        "find_installed_extension_name", "find_unpacked_extension_path", "history", "new_startup_page",
        "open_tabs_info", "profile_name", "shortcuts_on_desktop", "url_dashPart"
    }),
    "getters.commands": frozenset({
        "rule", "rule_relativeTime", "time_diff_range", "vm_command_error", "vm_command_line"
    }),
    "getters.desktop": frozenset({
        "list_directory", "vm_screen_size", "vm_wallpaper", "vm_window_size"
    }),
    "getters.files": frozenset({
        "content_from_vm_file", "embedded_file", "vm_file"
    }),
}

METRICS: frozenset[str] = frozenset().union(*METRIC_MODULES.values())
GETTERS: frozenset[str] = frozenset().union(*GETTER_MODULES.values())

# metrics/table.py: the compare_table rule types implemented (the importer skips a task using any other).
# style evaluates conditional formats of the expression and cellIs types; a sheet with another type gives
# no verdict (OSWorld's own metric evaluates expression formats only).
TABLE_RULES: frozenset[str] = frozenset({
    "sheet_name", "sheet_data", "sheet_print", "sheet_fuzzy", "sparkline", "chart", "freeze", "zoom",
    "data_validation", "row_props", "col_props", "filter", "pivot_table", "check_cell", "style",
})
