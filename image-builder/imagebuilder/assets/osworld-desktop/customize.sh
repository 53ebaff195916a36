#!/bin/sh
# mmdebstrap --customize-hook for osworld-desktop, run after linux-desktop's own hook.
# $1: the root being built, $2: this assets directory, $3: the display size (unused here).
# What OSWorld's tasks take for granted on their desktop, written once so no application asks a
# first-start question: the session's locale, LibreOffice, VLC and Thunderbird settings.
set -eu
root=$1 assets=$2
in_root() { chroot "$root" "$@"; }

cp -a "$assets/rootfs/." "$root/"

# en_US.UTF-8, the session's locale (lightdm's session reads /etc/default/locale through pam_env):
# OSWorld compares `ls` order and formatted numbers as they come out under it.
echo "en_US.UTF-8 UTF-8" > "$root/etc/locale.gen"
in_root locale-gen >/dev/null
printf 'LANG=en_US.UTF-8\n' > "$root/etc/default/locale"

home="$root/home/user"
# LibreOffice: no first-start wizard, tip of the day or "what's new" bar, and a document kept in
# its own format (an .xlsx saved as .xlsx) without the Keep Current Format question.
lo="$home/.config/libreoffice/4/user"
mkdir -p "$lo"
version=$(in_root dpkg-query -W -f '${Version}' libreoffice-core | sed -E 's/^[0-9]+://; s/^([0-9]+\.[0-9]+).*/\1/')
cat > "$lo/registrymodifications.xcu" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="WarnAlienFormat" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Setup/Office"><prop oor:name="ooSetupInstCompleted" oor:op="fuse"><value>true</value></prop></item>
<item oor:path="/org.openoffice.Setup/Product"><prop oor:name="ooSetupLastVersion" oor:op="fuse"><value>$version</value></prop></item>
<item oor:path="/org.openoffice.Setup/Product"><prop oor:name="LastTimeGetInvolvedShown" oor:op="fuse"><value>2147483647</value></prop></item>
<item oor:path="/org.openoffice.Setup/Product"><prop oor:name="LastTimeDonateShown" oor:op="fuse"><value>2147483647</value></prop></item>
</oor:items>
XML

# VLC: no privacy question on first start; its HTTP interface on the guest's loopback with the
# password OSWorld's VLC getter uses, so a check can read what is playing.
mkdir -p "$home/.config/vlc"
cat > "$home/.config/vlc/vlcrc" <<'INI'
[core]
metadata-network-access=0
extraintf=http
http-host=127.0.0.1
http-port=8080
[qt]
qt-privacy-ask=0
[lua]
http-password=password
INI

# Thunderbird: no default-client question and no data-reporting bar (the tasks bring their own
# profile; a blank start still opens its account wizard, which is the application, not a dialog of ours).
for prefs in "$root/etc/thunderbird/pref" "$root/usr/lib/thunderbird/defaults/pref"; do
  if [ -d "$prefs" ]; then
    cat > "$prefs/gh-osworld.js" <<'JS'
pref("mail.shell.checkDefaultClient", false);
pref("datareporting.policy.dataSubmissionPolicyBypassNotification", true);
pref("datareporting.policy.dataSubmissionEnabled", false);
pref("app.update.enabled", false);
JS
    break
  fi
done

# Chromium: a profile that exists before its first start, as OSWorld's snapshot's does. Its setups edit
# ~/.config/google-chrome/Default/Preferences with jq before they start Chrome; with no file the edit
# failed and a check of the startup page printed True untouched. Chrome fills in the rest of `{}`.
mkdir -p "$home/.config/google-chrome/Default"
printf '{}\n' > "$home/.config/google-chrome/Default/Preferences"

chown -R 1000:1000 "$home"
