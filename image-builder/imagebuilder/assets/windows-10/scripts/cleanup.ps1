# Seal: remove the cached answer file (it holds the account password, encoded), temporary files and
# superseded components, so the image is small and carries nothing from the build.
$ErrorActionPreference = 'Stop'
Remove-Item -Force -ErrorAction SilentlyContinue -Path @(
    "$env:WINDIR\Panther\unattend.xml", "$env:WINDIR\Panther\Unattend\unattend.xml",
    "$env:WINDIR\System32\Sysprep\unattend.xml")
Remove-Item -Recurse -Force -ErrorAction SilentlyContinue -Path @("$env:TEMP\*", "$env:WINDIR\Temp\*")
Dism.exe /Online /Cleanup-Image /StartComponentCleanup /ResetBase /Quiet
if ($LASTEXITCODE -ne 0) { throw "DISM component cleanup failed with exit code $LASTEXITCODE" }
Get-EventLog -List | ForEach-Object { Clear-EventLog -LogName $_.Log -ErrorAction SilentlyContinue }
