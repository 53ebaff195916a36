# Optional (--sysprep): generalize the image. Sysprep powers the machine off itself; every first
# boot of the image then runs specialize and OOBE again (minutes), so save a start state after it.
$ErrorActionPreference = 'Stop'
$config = Get-PSDrive -PSProvider FileSystem | Where-Object { Test-Path ($_.Root + 'gh-config.txt') } |
    Select-Object -First 1
if (-not $config) { throw 'the build config ISO is not attached' }
$answer = "$env:WINDIR\Temp\gh-sysprep.xml"
Copy-Item -Force ($config.Root + 'sysprep-unattend.xml') $answer
Start-Process -FilePath "$env:WINDIR\System32\Sysprep\sysprep.exe" `
    -ArgumentList @('/generalize', '/oobe', '/shutdown', '/quiet', "/unattend:$answer")
