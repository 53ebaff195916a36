# The screen must stay on and unlocked: agents and screenshots see the desktop, never a lock screen.
$ErrorActionPreference = 'Stop'
powercfg.exe /change monitor-timeout-ac 0
powercfg.exe /change standby-timeout-ac 0
powercfg.exe /change disk-timeout-ac 0
powercfg.exe /change hibernate-timeout-ac 0
powercfg.exe /hibernate off
# No password prompt on wake.
powercfg.exe /setacvalueindex SCHEME_CURRENT SUB_NONE CONSOLELOCK 0
powercfg.exe /setactive SCHEME_CURRENT
$p = 'HKLM:\SOFTWARE\Policies\Microsoft\Windows\Personalization'
New-Item -Path $p -Force | Out-Null
Set-ItemProperty -Path $p -Name NoLockScreen -Value 1 -Type DWord
$d = 'HKCU:\Control Panel\Desktop'
Set-ItemProperty -Path $d -Name ScreenSaveActive -Value '0'
Set-ItemProperty -Path $d -Name ScreenSaverIsSecure -Value '0'
