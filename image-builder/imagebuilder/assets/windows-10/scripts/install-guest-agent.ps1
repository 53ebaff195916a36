# virtio drivers (vioserial carries the guest-agent channel) and the QEMU guest agent, from the
# virtio-win ISO, silently.
$ErrorActionPreference = 'Stop'
$iso = Get-PSDrive -PSProvider FileSystem | Where-Object { Test-Path ($_.Root + 'virtio-win-gt-x64.msi') } |
    Select-Object -First 1
if (-not $iso) { throw 'the virtio-win ISO is not attached (no virtio-win-gt-x64.msi on any drive)' }
foreach ($msi in @('virtio-win-gt-x64.msi', 'guest-agent\qemu-ga-x86_64.msi')) {
    $p = Start-Process -FilePath msiexec.exe -Wait -PassThru `
        -ArgumentList @('/i', ($iso.Root + $msi), '/qn', '/norestart')
    if ($p.ExitCode -notin @(0, 3010)) { throw "msiexec $msi failed with exit code $($p.ExitCode)" }
}
Set-Service -Name QEMU-GA -StartupType Automatic
Start-Service -Name QEMU-GA
