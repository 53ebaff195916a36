# Free space must read as zeros so qemu-img's compression drops it: TRIM first (virtio discard
# unmaps the blocks), then overwrite whatever TRIM did not release.
$ErrorActionPreference = 'Stop'
Optimize-Volume -DriveLetter C -ReTrim
$path = 'C:\gh-zero.fill'
$buffer = New-Object byte[] (64MB)
$stream = [System.IO.File]::OpenWrite($path)
try {
    while ($true) { $stream.Write($buffer, 0, $buffer.Length) }
} catch [System.IO.IOException] {
    # disk full: that is the point
} finally {
    $stream.Close()
    Remove-Item -Force $path
}
Optimize-Volume -DriveLetter C -ReTrim
