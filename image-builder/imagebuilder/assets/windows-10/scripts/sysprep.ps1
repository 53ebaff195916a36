# Optional (--sysprep): generalize the image. Every first boot of the image then runs specialize and
# OOBE again (minutes), so save a start state after it.
# The answer file carries the encoded passwords: sysprep runs to completion (/quit, not /shutdown)
# so that it has read and cached the file before the copy in Temp is removed, and the cached copy
# in Panther is removed by SetupComplete.cmd once OOBE has used it. Then the machine powers off.
$ErrorActionPreference = 'Stop'
$config = Get-PSDrive -PSProvider FileSystem | Where-Object { Test-Path ($_.Root + 'gh-config.txt') } |
    Select-Object -First 1
if (-not $config) { throw 'the build config ISO is not attached' }
$answer = "$env:WINDIR\Temp\gh-sysprep.xml"
Copy-Item -Force ($config.Root + 'sysprep-unattend.xml') $answer
$scripts = "$env:WINDIR\Setup\Scripts"
New-Item -ItemType Directory -Force -Path $scripts | Out-Null
Set-Content -Path "$scripts\SetupComplete.cmd" -Encoding ASCII -Value @(
    '@echo off',
    'del /q /f "%WINDIR%\Panther\unattend.xml" "%WINDIR%\Panther\unattend-original.xml" 2>nul',
    'del /q /f "%WINDIR%\Temp\gh-sysprep.xml" 2>nul'
)
try {
    $p = Start-Process -FilePath "$env:WINDIR\System32\Sysprep\sysprep.exe" -Wait -PassThru `
        -ArgumentList @('/generalize', '/oobe', '/quit', '/quiet', "/unattend:$answer")
    if ($p.ExitCode -ne 0) { throw "sysprep exited with $($p.ExitCode); see $env:WINDIR\System32\Sysprep\Panther\setuperr.log" }
} finally {
    Remove-Item -Force -ErrorAction SilentlyContinue $answer
}
if (Test-Path $answer) { throw "the sysprep answer file $answer could not be removed" }
# Power off a few seconds after this script has returned its result over WinRM.
Start-Process -FilePath "$env:WINDIR\System32\shutdown.exe" -ArgumentList @('/s', '/t', '5', '/f')
