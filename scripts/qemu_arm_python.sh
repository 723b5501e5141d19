#!/bin/sh
# An aarch64 Python 3.11 with numpy and onnxruntime that runs on x86_64 under qemu-user, for
# tests/test_kernels_native.py's ONNX Runtime check (EDGEPREFILL_ARM_PYTHON=FOLDER/armpython).
# Debian/Ubuntu, as root (apt-get download needs the arm64 package lists for a moment):
#
#   apt-get install g++-aarch64-linux-gnu qemu-user
#   sh scripts/qemu_arm_python.sh FOLDER
#
# Nothing arm64 is installed on the system: the packages are unpacked into FOLDER/root, the
# arm64 architecture is removed from dpkg again afterwards.
set -eu
folder=$(mkdir -p "$1" && cd "$1" && pwd)
python=${PYTHON:-python3}
cd "$folder"

dpkg --add-architecture arm64
trap 'dpkg --remove-architecture arm64; apt-get update -qq' EXIT
apt-get update -qq
mkdir -p debs root site
(cd debs && apt-get download python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
  libpython3.11-stdlib:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 \
  libbz2-1.0:arm64 liblzma5:arm64 libsqlite3-0:arm64 libuuid1:arm64 libncursesw6:arm64 \
  libtinfo6:arm64 libreadline8:arm64 libcrypt1:arm64)
for deb in debs/*.deb; do dpkg -x "$deb" root; done
# The C and C++ runtimes from the cross toolchain, and the loader where binaries look for it.
mkdir -p root/lib/aarch64-linux-gnu
cp -an /usr/aarch64-linux-gnu/lib/. root/lib/aarch64-linux-gnu/
ln -sf aarch64-linux-gnu/ld-linux-aarch64.so.1 root/lib/ld-linux-aarch64.so.1

"$python" -m pip download --only-binary=:all: --no-deps --python-version 3.11 \
  --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 -d wheels numpy onnxruntime
for wheel in wheels/*.whl; do "$python" -m zipfile -e "$wheel" site; done

# qemu-user 7.2 hands the host's x86 /proc/cpuinfo to the guest, and ONNX Runtime's cpuinfo
# crashes on import without Arm lines (a segfault). Paths under qemu's -L prefix win: a
# two-core Jetson Orin's cpuinfo and CPU lists there.
mkdir -p root/proc root/sys/devices/system/cpu
for cpu in 0 1; do
  printf 'processor\t: %s\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm paca pacg\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd42\nCPU revision\t: 1\n\n' "$cpu"
done > root/proc/cpuinfo
for name in possible present online; do echo 0-1 > "root/sys/devices/system/cpu/$name"; done
echo 255 > root/sys/devices/system/cpu/kernel_max

cat > armpython <<'END'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
exec qemu-aarch64 -L "$here/root" \
  -E LD_LIBRARY_PATH=/lib/aarch64-linux-gnu:/usr/lib/aarch64-linux-gnu \
  -E PYTHONPATH="$here/site" "$here/root/usr/bin/python3.11" "$@"
END
chmod +x armpython
./armpython -c "import onnxruntime, platform; print(platform.machine(), onnxruntime.__version__)"
