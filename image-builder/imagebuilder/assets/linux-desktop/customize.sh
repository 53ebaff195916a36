#!/bin/sh
# mmdebstrap --customize-hook for linux-desktop, run on the host after every package is installed.
# $1: the root being built, $2: this assets directory, $3: the display size (e.g. 1280x800).
# Everything here is configuration a person would otherwise click through on a first start.
set -eu
root=$1 assets=$2 size=$3
in_root() { chroot "$root" "$@"; }

cp -a "$assets/rootfs/." "$root/"
echo "$size" > "$root/etc/gh-display"
chmod 0440 "$root/etc/sudoers.d/gh-user"

# The signed-in user: uid 1000, sudo without a password (sudoers.d/gh-user), audio and video.
in_root useradd -m -u 1000 -U -s /bin/bash -c "Desktop User" -G sudo,audio,video,plugdev user
home="$root/home/user"
for d in Desktop Documents Downloads Music Pictures Public Templates Videos; do mkdir -p "$home/$d"; done
in_root runuser -u user -- env HOME=/home/user xdg-user-dirs-update
# The panel's default layout, so its first start asks nothing ("default config or empty panel?").
conf="$home/.config/xfce4/xfconf/xfce-perchannel-xml"
mkdir -p "$conf"
cp "$root/etc/xdg/xfce4/panel/default.xml" "$conf/xfce4-panel.xml"
# No screen saver, lock or display power management in the session either (the X server runs
# with -s 0 -dpms already): settings a person would switch off once, written as xfconf keeps them.
cat > "$conf/xfce4-session.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<channel name="xfce4-session" version="1.0">
  <property name="general" type="empty">
    <property name="SaveOnExit" type="bool" value="false"/>
    <property name="LockCommand" type="string" value=""/>
    <property name="StartAssistiveTechnologies" type="bool" value="true"/>
  </property>
  <property name="shutdown" type="empty">
    <property name="LockScreen" type="bool" value="false"/>
  </property>
</channel>
XML
# Accessibility on for every toolkit (the default of org.gnome.desktop.interface
# toolkit-accessibility, from rootfs/usr/share/glib-2.0/schemas): the applications register their
# AT-SPI trees, which GET {machine.url}/accessibility reads (docs/desktop-guests.md).
in_root glib-compile-schemas /usr/share/glib-2.0/schemas
# A Firefox profile in place (the browser makes its files on first start), so a setting can be
# put into it before Firefox ever ran, as a hijacker's installer would.
prof="$home/.mozilla/firefox"
mkdir -p "$prof/gh.default"
cat > "$prof/profiles.ini" <<'INI'
[Profile0]
Name=default
IsRelative=1
Path=gh.default
Default=1

[General]
StartWithLastProfile=1
Version=2
INI
chown -R 1000:1000 "$home"

# Boot straight to the signed-in desktop; nothing runs on a timer behind an attempt's back.
in_root systemctl set-default graphical.target
for unit in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer e2scrub_reap.service \
    fstrim.timer logrotate.timer dpkg-db-backup.timer systemd-timesyncd.service cron.service \
    networking.service; do
  in_root systemctl mask "$unit" >/dev/null 2>&1 || true
done
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* 2>/dev/null || true
