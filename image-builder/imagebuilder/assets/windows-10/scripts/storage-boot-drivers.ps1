# The image is installed on a virtio disk (viostor is a boot driver already); make the inbox AHCI
# driver a boot driver too, so the same image also boots from a SATA disk instead of stopping with
# INACCESSIBLE_BOOT_DEVICE.
$ErrorActionPreference = 'Stop'
$svc = 'HKLM:\SYSTEM\CurrentControlSet\Services\storahci'
Set-ItemProperty -Path $svc -Name Start -Value 0 -Type DWord
Remove-Item -Path "$svc\StartOverride" -Recurse -Force -ErrorAction SilentlyContinue
