# Telemetry at its minimum (Pro treats 0 as "Required"), no consumer suggestions or tips.
$ErrorActionPreference = 'Stop'
$dc = 'HKLM:\SOFTWARE\Policies\Microsoft\Windows\DataCollection'
New-Item -Path $dc -Force | Out-Null
Set-ItemProperty -Path $dc -Name AllowTelemetry -Value 0 -Type DWord
$cc = 'HKLM:\SOFTWARE\Policies\Microsoft\Windows\CloudContent'
New-Item -Path $cc -Force | Out-Null
Set-ItemProperty -Path $cc -Name DisableWindowsConsumerFeatures -Value 1 -Type DWord
Set-ItemProperty -Path $cc -Name DisableSoftLanding -Value 1 -Type DWord
Stop-Service -Name DiagTrack -Force -ErrorAction SilentlyContinue
Set-Service -Name DiagTrack -StartupType Disabled
