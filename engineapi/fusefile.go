package engineapi

import "path/filepath"

// FUSEFileName is the name of the file an instance manager with --fuse-dir
// serves each exported volume as, in a directory named for the volume.
const FUSEFileName = "disk"

// FUSEFile is where an instance manager with fuseDir serves volume as a
// file; the CSI node plugin puts its loop device there.
func FUSEFile(fuseDir, volume string) string { return filepath.Join(fuseDir, volume, FUSEFileName) }

// FUSEFileVolume is the volume whose file path is, when path is one in
// fuseDir (as FUSEFile makes them).
func FUSEFileVolume(fuseDir, path string) (string, bool) {
	if filepath.Base(path) != FUSEFileName || filepath.Dir(filepath.Dir(path)) != fuseDir {
		return "", false
	}
	return filepath.Base(filepath.Dir(path)), true
}
