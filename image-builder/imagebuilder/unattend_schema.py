"""A schema-level check of Windows answer files, for the components gh-runner's builds use.

Not Microsoft's full schema (that ships only inside the ADK), but the same rules for the settings
we write: the namespace, known passes, each component's identity attributes and the passes it is
valid in, the element tree of each setting, list items marked `wcm:action="add"` (keyed ones with
`wcm:keyValue`), and value types. Setting names and passes follow the Unattended Windows Setup
Reference. `check_unattend` returns every problem found, so a test or the build can show them all.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TypeAlias

NS = "urn:schemas-microsoft-com:unattend"
WCM = "http://schemas.microsoft.com/WMIConfig/2002/State"
PASSES = {"windowsPE", "offlineServicing", "generalize", "specialize", "auditSystem", "auditUser", "oobeSystem"}
IDENTITY = {"processorArchitecture": {"amd64", "x86", "arm64"}, "publicKeyToken": {"31bf3856ad364e35"},
            "language": {"neutral"}, "versionScope": {"nonSxS"}}

# A value spec: "str" | "bool" | "int" | a set of allowed strings | a dict of child specs.
# A child name ending in "*" is a list item ("+" a keyed list item, needing wcm:keyValue).
Spec: TypeAlias = "str | set[str] | dict[str, Spec]"

_LOCALES: dict[str, Spec] = {"InputLocale": "str", "SystemLocale": "str", "UILanguage": "str", "UserLocale": "str",
                             "UILanguageFallback": "str"}
_PASSWORD: dict[str, Spec] = {"Value": "str", "PlainText": "bool"}
_SHOW_UI = {"Always", "OnError", "Never", "Hide"}
_COMMAND: dict[str, Spec] = {"Order": "int", "CommandLine": "str", "Description": "str", "RequiresUserInput": "bool"}

# component -> setting -> (passes where the setting is valid, its spec)
COMPONENTS: dict[str, dict[str, tuple[set[str], Spec]]] = {
    "Microsoft-Windows-International-Core-WinPE": {
        "SetupUILanguage": ({"windowsPE"}, {"UILanguage": "str", "WillShowUI": _SHOW_UI}),
        **{k: ({"windowsPE"}, v) for k, v in _LOCALES.items()},
    },
    "Microsoft-Windows-International-Core": {k: ({"specialize", "oobeSystem"}, v) for k, v in _LOCALES.items()},
    "Microsoft-Windows-PnpCustomizationsWinPE": {
        "DriverPaths": ({"windowsPE"}, {"PathAndCredentials+": {
            "Path": "str", "Credentials": {"Domain": "str", "Username": "str", "Password": "str"}}}),
    },
    "Microsoft-Windows-Setup": {
        "DiskConfiguration": ({"windowsPE"}, {
            "WillShowUI": _SHOW_UI,
            "Disk*": {
                "DiskID": "int", "WillWipeDisk": "bool",
                "CreatePartitions": {"CreatePartition*": {
                    "Order": "int", "Type": {"Primary", "EFI", "MSR", "Extended", "Logical"}, "Size": "int",
                    "Extend": "bool"}},
                "ModifyPartitions": {"ModifyPartition*": {
                    "Order": "int", "PartitionID": "int", "Label": "str", "Letter": "str",
                    "Format": {"NTFS", "FAT32"}, "Active": "bool", "Extend": "bool", "TypeID": "str"}},
            },
        }),
        "ImageInstall": ({"windowsPE"}, {"OSImage": {
            "InstallFrom": {"Path": "str", "MetaData*": {"Key": "str", "Value": "str"}},
            "InstallTo": {"DiskID": "int", "PartitionID": "int"},
            "InstallToAvailablePartition": "bool", "WillShowUI": _SHOW_UI,
        }}),
        "UserData": ({"windowsPE"}, {
            "AcceptEula": "bool", "FullName": "str", "Organization": "str",
            "ProductKey": {"Key": "str", "WillShowUI": _SHOW_UI},
        }),
        "DynamicUpdate": ({"windowsPE"}, {"Enable": "bool", "WillShowUI": _SHOW_UI}),
        "EnableFirewall": ({"windowsPE"}, "bool"),
        "EnableNetwork": ({"windowsPE"}, "bool"),
        "RunSynchronous": ({"windowsPE"}, {"RunSynchronousCommand*": {
            "Order": "int", "Path": "str", "Description": "str", "WillReboot": {"Always", "OnRequest", "Never"}}}),
    },
    "Microsoft-Windows-Shell-Setup": {
        "ComputerName": ({"specialize", "offlineServicing"}, "str"),
        "TimeZone": ({"specialize", "oobeSystem", "auditSystem"}, "str"),
        "RegisteredOwner": ({"specialize", "oobeSystem", "auditSystem"}, "str"),
        "ProductKey": ({"specialize"}, "str"),
        "OOBE": ({"oobeSystem"}, {
            "HideEULAPage": "bool", "HideLocalAccountScreen": "bool", "HideOEMRegistrationScreen": "bool",
            "HideOnlineAccountScreens": "bool", "HideWirelessSetupInOOBE": "bool", "NetworkLocation":
            {"Home", "Work", "Other"}, "ProtectYourPC": {"1", "2", "3"}, "SkipMachineOOBE": "bool",
            "SkipUserOOBE": "bool",
        }),
        "UserAccounts": ({"oobeSystem", "auditSystem"}, {
            "AdministratorPassword": _PASSWORD,
            "LocalAccounts": {"LocalAccount*": {
                "Name": "str", "DisplayName": "str", "Group": "str", "Description": "str", "Password": _PASSWORD}},
        }),
        "AutoLogon": ({"oobeSystem", "auditSystem", "specialize"}, {
            "Enabled": "bool", "Username": "str", "Domain": "str", "LogonCount": "int", "Password": _PASSWORD}),
        "FirstLogonCommands": ({"oobeSystem"}, {"SynchronousCommand*": _COMMAND}),
        "LogonCommands": ({"oobeSystem", "auditUser"}, {"AsynchronousCommand*": _COMMAND}),
    },
    "Microsoft-Windows-Security-SPP-UX": {"SkipAutoActivation": ({"specialize"}, "bool")},
    "Microsoft-Windows-SQMApi": {"CEIPEnabled": ({"specialize", "oobeSystem"}, {"0", "1"})},
    "Microsoft-Windows-Deployment": {
        "RunSynchronous": ({"specialize", "auditUser"}, {"RunSynchronousCommand*": {
            "Order": "int", "Path": "str", "Description": "str", "WillReboot": {"Always", "OnRequest", "Never"}}}),
    },
}


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _check_value(el: ET.Element, spec: Spec, where: str, errors: list[str]) -> None:
    text = (el.text or "").strip()
    if isinstance(spec, dict):
        if text:
            errors.append(f"{where}: has text {text[:30]!r} but takes child elements")
        seen: set[str] = set()
        for child in el:
            name = _local(child.tag)
            key = next((k for k in spec if k.rstrip("*+") == name), None)
            if key is None:
                errors.append(f"{where}: unknown element {name!r} (allowed: {', '.join(k.rstrip('*+') for k in spec)})")
                continue
            if key.endswith(("*", "+")):
                if child.get(f"{{{WCM}}}action") != "add":
                    errors.append(f"{where}/{name}: list item needs wcm:action=\"add\"")
                if key.endswith("+") and not child.get(f"{{{WCM}}}keyValue"):
                    errors.append(f"{where}/{name}: keyed list item needs wcm:keyValue")
            elif name in seen:
                errors.append(f"{where}: {name!r} appears twice")
            seen.add(name)
            _check_value(child, spec[key], f"{where}/{name}", errors)
        return
    if len(el):
        errors.append(f"{where}: takes a value, not child elements")
    if not text:
        errors.append(f"{where}: is empty")
    elif spec == "bool" and text not in ("true", "false"):
        errors.append(f"{where}: {text!r} is not true or false")
    elif spec == "int" and not text.isdigit():
        errors.append(f"{where}: {text!r} is not a whole number")
    elif isinstance(spec, set) and text not in spec:
        errors.append(f"{where}: {text!r} is not one of {sorted(spec)}")


def check_unattend(xml_text: str) -> list[str]:
    """Every schema problem in an answer file; an empty list means it passes."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as e:
        return [f"not well-formed XML: {e}"]
    errors: list[str] = []
    if root.tag != f"{{{NS}}}unattend":
        return [f"root element must be unattend in namespace {NS}, not {root.tag}"]
    passes_seen: set[str] = set()
    for settings in root:
        if _local(settings.tag) == "servicing":
            continue
        if _local(settings.tag) != "settings":
            errors.append(f"unexpected element {_local(settings.tag)!r} under unattend")
            continue
        pass_name = settings.get("pass", "")
        if pass_name not in PASSES:
            errors.append(f"settings pass {pass_name!r} is not a configuration pass")
            continue
        if pass_name in passes_seen:
            errors.append(f"settings pass {pass_name!r} appears twice")
        passes_seen.add(pass_name)
        components: set[str] = set()
        for comp in settings:
            name = comp.get("name", "")
            where = f"{pass_name}/{name}"
            if _local(comp.tag) != "component":
                errors.append(f"{pass_name}: unexpected element {_local(comp.tag)!r}")
                continue
            if name not in COMPONENTS:
                errors.append(f"{where}: component not known to this check")
                continue
            if name in components:
                errors.append(f"{where}: component appears twice in the pass")
            components.add(name)
            for attr, allowed in IDENTITY.items():
                if comp.get(attr) not in allowed:
                    errors.append(f"{where}: attribute {attr}={comp.get(attr)!r}, expected one of {sorted(allowed)}")
            settings_spec = COMPONENTS[name]
            seen: set[str] = set()
            for setting in comp:
                sname = _local(setting.tag)
                if sname not in settings_spec:
                    errors.append(f"{where}: unknown setting {sname!r}")
                    continue
                valid_passes, spec = settings_spec[sname]
                if pass_name not in valid_passes:
                    only = ", ".join(sorted(valid_passes))
                    errors.append(f"{where}/{sname}: not valid in pass {pass_name} (only {only})")
                if sname in seen:
                    errors.append(f"{where}: setting {sname!r} appears twice")
                seen.add(sname)
                _check_value(setting, spec, f"{where}/{sname}", errors)
    return errors
